"""Exercise: ReLU's backward (the activation of the feed-forward network, Eq. 2)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
from numformer.layers.relu import ReLU, relu_backward, relu_forward

from ..exercise import Exercise


def no_mask(dy, positive):
    """dy passed straight through: where the input was negative the output is constant 0, so its gradient is 0."""
    return dy


def mask_without_dy(dy, positive):
    """The mask [x > 0] returned alone: it is the local derivative; the chain rule multiplies it by dy."""
    return positive.astype(dy.dtype)


def inverted_mask(dy, positive):
    """The gradient flows where the input was negative: it must flow where x > 0 (the unit was active)."""
    return dy * ~positive


def away_from_zero(x):
    """ReLU has a kink at 0; finite differences across it measure nothing: keep entries off it."""
    x[np.abs(x) < 1e-3] = 0.5
    return x


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    x = away_from_zero(rng.standard_normal((3, 6, 8)))
    rows = away_from_zero(rng.standard_normal((4, 5)))
    rows[0] = -np.abs(rows[0])  # a row with every unit off
    rows[1] = np.abs(rows[1])   # and one with every unit on
    return [GradCase("ReLU", f"x {x.shape}", cls(), {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("ReLU", "a row all negative, a row all positive", cls(), {"x": rows},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


EXERCISE = Exercise(
    name="relu", title="ReLU's backward", paper="Eq. 2", target=relu_backward, layer=ReLU, cases=cases,
    outputs=("dx",), mistakes=(no_mask, mask_without_dy, inverted_mask), show=(relu_forward,), swap="ReLU",
    notes="positive is the boolean array [x > 0] that forward kept; dy and the result have x's shape.")
