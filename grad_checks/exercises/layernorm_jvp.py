"""Exercise: LayerNorm's forward mode, its JVP (the directional derivative of the forward, Section 3.1)."""
from __future__ import annotations

import dataclasses

from numformer.layers.layernorm import LayerNorm, layernorm_forward, layernorm_jvp

from ..case_helpers import forward_mode
from ..exercise import Exercise
from .layernorm import cases as layernorm_cases


def _y_dot(xhat_dot, xhat, gamma, gamma_dot, beta_dot):
    return xhat_dot * gamma + xhat * gamma_dot + beta_dot


def mean_term_forgotten(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """xhat_dot lacks - mean(x_dot): moving x moves its mean, which the centring takes off again."""
    r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
    return _y_dot(xhat_dot, xhat, gamma, gamma_dot, beta_dot), xhat_dot, r_dot


def variance_term_forgotten(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """xhat_dot lacks - xhat * mean(xhat * x_dot): r moves with x too (xhat = (x - mu) r), the term (x - mu) r_dot."""
    r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True))
    return _y_dot(xhat_dot, xhat, gamma, gamma_dot, beta_dot), xhat_dot, r_dot


def r_dot_with_r_cubed(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """r_dot = -r^3 mean(xhat x_dot) mixes the two forms: -r^3 goes with mean((x - mu) x_dot), and x - mu = xhat / r."""
    r_dot = -r ** 3 * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True) - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
    return _y_dot(xhat_dot, xhat, gamma, gamma_dot, beta_dot), xhat_dot, r_dot


def gain_tangent_forgotten(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """y_dot lacks xhat * gamma_dot: the gain moves too (the product rule on xhat * gamma)."""
    r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True) - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
    return xhat_dot * gamma + beta_dot, xhat_dot, r_dot


def r_dot_sign_flipped(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """r_dot's sign: r = (var + eps)^(-1/2) falls as the variance grows, so r_dot = -r^2 mean(xhat x_dot)."""
    r_dot = r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True) - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
    return _y_dot(xhat_dot, xhat, gamma, gamma_dot, beta_dot), xhat_dot, r_dot


def cases(cls, seed):
    """The backward exercise's cases, each with its forward mode: x, gamma and beta given tangents
    (numformer.forward_mode)."""
    return [dataclasses.replace(case, **forward_mode("x")) for case in layernorm_cases(cls, seed)]


EXERCISE = Exercise(
    stage="forward mode", rank=1,
    equivalent={"minus of `-1` dropped": "mean(axis=1) is mean(axis=-1): the layer hands layernorm_jvp 2-d (n, d) "
                                         "rows, whose axis 1 is the last one"},
    name="layernorm_jvp", title="LayerNorm's JVP (forward mode)", paper="Section 3.1; Ba et al. 2016",
    target=layernorm_jvp, layer=LayerNorm, cases=cases, outputs=("y_dot", "xhat_dot", "r_dot"), mode="jvp",
    show=(layernorm_forward,),
    names={"x_dot.mean(axis=-1, keepdims=True)": "mean(x_dot)", "xhat * x_dot": "xhat * x_dot",
           "(xhat * x_dot).mean(axis=-1, keepdims=True)": "mean(xhat * x_dot)"},
    symbols={"n": lambda a: a["x_dot"].shape[0], "d": lambda a: a["x_dot"].shape[-1]},
    mistakes=(mean_term_forgotten, variance_term_forgotten, r_dot_with_r_cubed, gain_tangent_forgotten,
              r_dot_sign_flipped),
    notes="The layer flattens the leading axes into rows: x_dot and xhat are (n, d), r (n, 1), gamma, gamma_dot and "
          "beta_dot (d,). Graded: y_dot along each tensor's tangent alone and along all of them at once, against "
          "central differences of the forward and numformer's own jvp.",
    forward="""
        Forward mode carries a tangent, a direction of change, through the forward: when x moves along x_dot and
        the parameters along gamma_dot and beta_dot, how fast does every output move? The forward, per row x of d
        features (the layer flattens the leading axes into n rows):

            mu   = (1/d) sum_j x_j
            var  = (1/d) sum_j (x_j - mu)^2
            r    = 1 / sqrt(var + eps)
            xhat = (x - mu) * r
            y    = gamma * xhat + beta          (elementwise: gamma and beta hold one entry per feature)

        Your function receives x_dot (n, d), the forward's xhat (n, d) and r (n, 1), gamma (d,) and the tangents
        gamma_dot and beta_dot (d,). It returns (y_dot, xhat_dot, r_dot): the tangents of y (n, d), xhat (n, d)
        and r (n, 1), the directional derivatives d/ds of each at x + s x_dot, gamma + s gamma_dot, beta + s
        beta_dot (the layer keeps xhat_dot and r_dot for the tangent of its backward).""",
    returns="Return (y_dot, xhat_dot, r_dot): the tangents of y (n, d), xhat (n, d) and r (n, 1), from x_dot (n, d), "
            "xhat (n, d), r (n, 1), gamma, gamma_dot and beta_dot (d,).",
    steps=("Differentiate each line of the forward along the tangent, in the forward's order (the chain rule run "
           "forwards): mu_dot = mean(x_dot) over the row.",
           "var_dot = (2/d) sum_j (x_j - mu)(x_dot_j - mu_dot) = 2 mean((x - mu) x_dot): the mu_dot term drops, since "
           "sum_j (x_j - mu) = 0.",
           "r = (var + eps)^(-1/2), so r_dot = -(1/2) r^3 var_dot = -r^3 mean((x - mu) x_dot); with x - mu = xhat / r "
           "that is r_dot = -r^2 mean(xhat * x_dot) (n, 1).",
           "xhat = (x - mu) r by the product rule: xhat_dot = (x_dot - mu_dot) r + (x - mu) r_dot = r * (x_dot - "
           "mean(x_dot) - xhat * mean(xhat * x_dot)): the backward's formula with x_dot for dxhat (xhat's Jacobian "
           "is symmetric).",
           "y = xhat * gamma + beta: y_dot = xhat_dot * gamma + xhat * gamma_dot + beta_dot. In NumPy a mean over the "
           "last axis with keepdims=True broadcasts back along the row."))
