"""Exercise: RMSNorm's backward (a norm in LayerNorm's place, Zhang and Sennrich 2019)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase

from grad_checks.exercise import Exercise

from .rmsnorm import ToyRMSNorm, rmsnorm_backward, rmsnorm_forward


def dropped_scale_term(dy, xhat, r, gamma):
    """dx lacks - xhat * mean(dxhat * xhat), the path through r: r depends on x too."""
    return r * dy * gamma, (dy * xhat).sum(axis=0)


def gamma_forgotten(dy, xhat, r, gamma):
    """dxhat = dy forgets the gain: y = xhat * gamma, so dxhat = dy * gamma."""
    return r * (dy - xhat * (dy * xhat).mean(axis=-1, keepdims=True)), (dy * xhat).sum(axis=0)


def mean_subtracted_as_in_layernorm(dy, xhat, r, gamma):
    """dx takes off mean(dxhat) as LayerNorm's does: RMSNorm subtracts no mean, so no such path exists."""
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0)


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, scale, shift in [("random gain, x (3, 6, 8)", (3, 6, 8), 3.0, 1.0),
                                      ("rows of three features (5, 3)", (5, 3), 1.0, 0.0)]:
        m = cls(shape[-1], dtype=np.float64)
        m.weight.data[:] = rng.standard_normal(shape[-1])  # not ones: those hide a forgotten gain
        out.append(GradCase("RMSNorm", name, m, {"x": scale * rng.standard_normal(shape) + shift},
                            lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}))
    return out


EXERCISE = Exercise(
    stage="normalisation",
    equivalent={"minus of `-1` dropped": "mean(axis=1) is mean(axis=-1): the layer hands rmsnorm_backward 2-d "
                                         "(n, d) rows, whose axis 1 is the last one"},
    name="rmsnorm_toy", title="RMSNorm's backward", paper="Section 3.1 with RMSNorm; Zhang and Sennrich 2019",
    target=rmsnorm_backward, layer=ToyRMSNorm, cases=cases, outputs=("dx", "dgamma"), show=(rmsnorm_forward,),
    swap="ToyRMSNorm", mistakes=(dropped_scale_term, gamma_forgotten, mean_subtracted_as_in_layernorm),
    notes="dy and xhat are (n, d), r (n, 1), gamma (d,); dgamma sums over every row.",
    forward="""
        The forward, per row x of d features: r = 1 / sqrt((1/d) sum_j x_j^2 + eps), xhat = x * r,
        y = gamma * xhat. Your function receives dy (n, d), xhat (n, d), r (n, 1) and gamma (d,) and returns
        (dx, dgamma).""",
    returns="Return (dx, dgamma): dL/dx (n, d) and dL/dgamma (d,), from dy, xhat, r and gamma.",
    steps=("dgamma = sum over rows of dy * xhat; dxhat = dy * gamma.",
           "xhat_j = x_j * r: two paths from x_i, directly and through r, with d r / d x_i = -(r^2 / d) xhat_i.",
           "Together: dx = r * (dxhat - xhat * mean(dxhat * xhat)), the mean over the row, keepdims=True."))
