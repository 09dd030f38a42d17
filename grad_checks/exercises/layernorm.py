"""Exercise: LayerNorm's backward (every residual sub-layer, Section 3.1)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
from numformer.layers.layernorm import LayerNorm, layernorm_backward, layernorm_forward

from ..exercise import Exercise


def dropped_mean_term(dy, xhat, r, gamma):
    """dx lacks - mean(dxhat): shifting x by a constant leaves xhat unchanged, so the mean of dxhat must come off."""
    dxhat = dy * gamma
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def dropped_variance_term(dy, xhat, r, gamma):
    """dx lacks - xhat * mean(dxhat * xhat), the path through the variance: r depends on x too."""
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def unbiased_variance(dy, xhat, r, gamma):
    """The variance term divides by d - 1 (the unbiased variance): LayerNorm's variance is mean((x - mu)^2), over d."""
    dxhat = dy * gamma
    d = dy.shape[-1]
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).sum(axis=-1, keepdims=True) / (d - 1))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def gamma_forgotten(dy, xhat, r, gamma):
    """dxhat = dy forgets the gain: y = xhat * gamma + beta, so dxhat = dy * gamma."""
    dxhat = dy
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def scale_forgotten(dy, xhat, r, gamma):
    """dx lacks the factor r = 1 / sqrt(var + eps): xhat = (x - mu) * r, so every path to x is scaled by r."""
    dxhat = dy * gamma
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def gain_gradient_without_xhat(dy, xhat, r, gamma):
    """dgamma = sum(dy) is the bias's gradient: gamma multiplies xhat, so dgamma = sum(dy * xhat)."""
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dy.sum(axis=0), dy.sum(axis=0)


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, scale, shift in [("random gain and bias, x (3, 6, 8)", (3, 6, 8), 3.0, 1.0),
                                      ("wide rows (2, 16), small spread", (2, 16), 0.2, -4.0),
                                      ("rows of three features (5, 3)", (5, 3), 1.0, 0.0)]:
        d = shape[-1]
        m = cls(d, dtype=np.float64)
        m.weight.data[:] = rng.standard_normal(d)  # not ones and zeros: those hide a forgotten gain
        m.bias.data[:] = rng.standard_normal(d)
        out.append(GradCase("LayerNorm", name, m, {"x": scale * rng.standard_normal(shape) + shift},
                            lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}))
    return out


EXERCISE = Exercise(
    stage="normalisation",
    equivalent={"minus of `-1` dropped": "mean(axis=1) is mean(axis=-1): the layer hands layernorm_backward 2-d "
                                         "(n, d) rows, whose axis 1 is the last one"},
    name="layernorm", title="LayerNorm's backward", paper="Section 3.1; Ba et al. 2016", target=layernorm_backward,
    names={"dxhat.mean(axis=-1, keepdims=True)": "mean(dxhat)", "dxhat * xhat": "dxhat * xhat",
           "(dxhat * xhat).mean(axis=-1, keepdims=True)": "mean(dxhat * xhat)"},
    symbols={"n": lambda a: a["dy"].shape[0], "d": lambda a: a["dy"].shape[-1]},
    layer=LayerNorm, cases=cases, outputs=("dx", "dgamma", "dbeta"), show=(layernorm_forward,), swap="LayerNorm",
    mistakes=(dropped_mean_term, dropped_variance_term, unbiased_variance, gamma_forgotten, scale_forgotten,
              gain_gradient_without_xhat),
    notes="The layer flattens the leading axes into rows: dy and xhat are (n, d), r (n, 1), gamma (d,). dgamma "
          "and dbeta sum over every row.",
    forward="""
        The forward, per row x of d features (the layer flattens the leading axes into n rows):

            mu   = (1/d) sum_j x_j
            var  = (1/d) sum_j (x_j - mu)^2
            r    = 1 / sqrt(var + eps)
            xhat = (x - mu) * r
            y    = gamma * xhat + beta          (elementwise: gamma and beta hold one entry per feature)

        Your function receives dy = dL/dy (n, d), the forward's xhat (n, d) and r (n, 1), and gamma (d,). It
        returns (dx, dgamma, dbeta): dL/dx (n, d), dL/dgamma (d,) and dL/dbeta (d,). gamma and beta are shared
        by every row.""",
    returns="Return (dx, dgamma, dbeta): dL/dx (n, d), dL/dgamma (d,) and dL/dbeta (d,), from dy (n, d), xhat (n, d), "
            "r (n, 1) and gamma (d,).",
    steps=("The parameters first. y = gamma * xhat + beta in every row, and gamma and beta are shared by the n "
           "rows, so their gradients add up over the rows: dbeta = sum over rows of dy, dgamma = sum over rows of "
           "dy * xhat.",
           "Into the normalised input: y depends on xhat through the gain only, so dxhat = dy * gamma (n, d). The "
           "rest is the backward of xhat = (x - mu) * r, where mu and r depend on the whole row.",
           "Keep the row fixed and write xhat_j = (x_j - mu) * r. Three paths lead from x_i to xhat_j: directly "
           "(d(x_j)/d(x_i) = 1 when i = j), through mu (d mu / d x_i = 1/d) and through r. So dx_i = r * dxhat_i "
           "- (r/d) sum_j dxhat_j + sum_j dxhat_j (x_j - mu) * (d r / d x_i).",
           "Through the variance: d var / d x_i = (2/d) (x_i - mu) (the mu terms cancel, since sum_j (x_j - mu) = "
           "0), and r = (var + eps)^(-1/2), so d r / d x_i = -r^3 (x_i - mu) / d = -(r^2 / d) xhat_i. Then "
           "sum_j dxhat_j (x_j - mu) d r/d x_i = -(r/d) xhat_i sum_j dxhat_j xhat_j.",
           "Together, with mean over the row's d features: dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * "
           "xhat)). In NumPy, a mean over the last axis that keeps its dimension (keepdims=True) broadcasts back "
           "along the row."))
