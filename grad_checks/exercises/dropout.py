"""Exercise: dropout's backward (Section 5.4: on every sub-layer output and on the embeddings)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.gradcheck import GradCase
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
    name="dropout", title="dropout's backward", paper="Section 5.4", target=dropout_backward, layer=Dropout,
    cases=cases, outputs=("dx",), show=(dropout_mask, dropout_forward), swap="Dropout",
    mistakes=(mask_without_scale, no_mask, scaled_twice),
    notes="mask is the m forward multiplied by (kept: 1/(1 - p), dropped: 0), with dy's shape. The checks replay "
          "one mask: the generator is restored before every forward.")
