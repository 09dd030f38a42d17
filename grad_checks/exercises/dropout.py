"""Exercise: dropout's backward (Section 5.4: on every sub-layer output and on the embeddings)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
from numformer.layers.dropout import Dropout, dropout_backward, dropout_forward, dropout_mask

from ..cases import _replay
from ..exercise import Exercise


def mask_without_scale(dy, mask):
    """The keep pattern without its 1/(1 - p): forward multiplied the kept entries by 1/(1 - p), so backward must too."""
    return dy * (mask != 0)


def no_mask(dy, mask):
    """dy passed straight through: a dropped entry did not reach the output, so its gradient is 0."""
    return dy


def scaled_twice(dy, mask):
    """1/(1 - p) applied twice: the mask m already holds it (m = keep / (1 - p)); dx = dy * m."""
    return dy * mask * mask.max()


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, p, shape in [("p 0.3, x (3, 6, 8)", 0.3, (3, 6, 8)), ("p 0.5, x (4, 10)", 0.5, (4, 10))]:
        rs = RandomState(seed + 7)
        out.append(GradCase("Dropout", f"{name}, one mask replayed", cls(p, rs), {"x": rng.standard_normal(shape)},
                            lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    stage="state",
    name="dropout", title="dropout's backward", paper="Section 5.4", target=dropout_backward, layer=Dropout,
    entry_sets=lambda a, shape: {"dropped": a["mask"] == 0} if a["mask"].shape == shape else {},
    symbols={"keep": lambda a: 1.0 / a["mask"].max()},  # 1 - p, the probability of keeping a unit
    cases=cases, outputs=("dx",), show=(dropout_mask, dropout_forward), swap="Dropout",
    mistakes=(mask_without_scale, no_mask, scaled_twice),
    notes="mask is the m forward multiplied by (kept: 1/(1 - p), dropped: 0), with dy's shape. The checks replay "
          "one mask: the generator is restored before every forward.",
    forward="""
        Inverted dropout (Section 5.4: on the output of every sub-layer, before it is added to the sub-layer
        input, and on the sums of the embeddings and the positional encodings; P_drop = 0.1). In training each
        element is kept with probability 1 - p and the kept ones are scaled by 1 / (1 - p), so that the
        expectation is unchanged and evaluation is the identity:

            m_i = [u_i >= p] / (1 - p)          u_i uniform in [0, 1), one per element
            y_i = x_i * m_i                     elementwise, x of any shape

        Forward draws the mask m once (dropout_mask) and keeps it: m has x's shape and dtype, and holds 1/(1-p) where
        the element was kept and 0 where it was dropped. It is a constant of the forward: nothing is drawn
        again in backward (the checks replay one mask). When dropout ends a sub-layer, forward also adds the
        residual (y = x * m + add, Section 3.1); that path is not your function's business: it returns the
        gradient with respect to x only.

        Your function receives dy = dL/dy (x's shape) and that mask m (x's shape). It returns dx = dL/dx, of x's
        shape.""",
    returns="Return dx = dL/dx, of x's shape, from dy (x's shape) and the forward's mask m (x's shape: "
            "1/(1-p) where kept, 0 where dropped).",
    steps=("y_i = x_i * m_i is elementwise, and m is a constant (drawn in forward, not a function of x), so the "
           "chain rule has no sum: dL/dx_i = dL/dy_i * dy_i/dx_i, and dx has x's shape.",
           "The local derivative of y_i = x_i * m_i with respect to x_i is m_i itself: 0 for a dropped element (it "
           "never reached the output, so no gradient flows back to it) and 1/(1 - p) for a kept one (the scale "
           "forward applied to the value applies to its gradient too).",
           "Whole backward: dx = dy * m, elementwise. In NumPy, multiply dy by mask and return it. The mask "
           "already holds the 1/(1 - p): do not apply it a second time, and do not reduce the mask to its 0/1 keep "
           "pattern either."))
