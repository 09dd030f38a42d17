"""Exercise: ReLU's backward (the activation of the feed-forward network, Eq. 2)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
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
    stage="elementwise",
    name="relu", title="ReLU's backward", paper="Eq. 2", target=relu_backward, layer=ReLU, cases=cases,
    outputs=("dx",), mistakes=(no_mask, mask_without_dy, inverted_mask), show=(relu_forward,), swap="ReLU",
    notes="positive is the boolean array [x > 0] that forward kept; dy and the result have x's shape.",
    forward="""
        The activation of the position-wise feed-forward network (Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2),
        applied elementwise to an array x of any shape:

            y_i = max(0, x_i)

        Forward also keeps positive = [x > 0], a boolean array of x's shape: True where the unit was active. At
        x_i = 0 exactly, where max(0, x) has its kink, the derivative is taken as 0 (as PyTorch does; positive
        is False there).

        Your function receives dy = dL/dy (x's shape) and positive (bool, x's shape); it does not get x. It
        returns dx = dL/dx, of x's shape and dy's dtype.""",
    returns="Return dx = dL/dx, of x's shape, from dy (x's shape) and the forward's active set positive (bool, "
            "x's shape).",
    steps=("The forward is elementwise: y_i depends on x_i alone, so the chain rule has no sum over other "
           "entries: dL/dx_i = dL/dy_i * dy_i/dx_i, and dx has x's shape. What remains is the local derivative "
           "dy_i/dx_i.",
           "On each side of 0, max(0, x) is simple: for x_i > 0 it is x_i itself, so dy_i/dx_i = 1; for x_i < 0 it "
           "is the constant 0, so dy_i/dx_i = 0 (the unit was off: nothing flows back through it). At x_i = 0 take "
           "0. So the local derivative is exactly the indicator [x_i > 0], which forward kept as positive.",
           "The indicator alone is only the local derivative: the chain rule multiplies it by dy. Whole backward: "
           "dx_i = dy_i * [x_i > 0], that is dy where the unit was active and 0 where it was not (not the other way "
           "round). In NumPy, multiply dy elementwise by the boolean array positive: a float times a bool is the "
           "float or 0, and the result keeps dy's dtype. No axis, no sum."))
