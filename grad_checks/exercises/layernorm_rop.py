"""Exercise: the tangent of LayerNorm's backward (Pearlmutter's R-operator, what Hessian-vector products are made of)."""
from __future__ import annotations

import numpy as np

from numformer.layers.layernorm import (LayerNorm, layernorm_backward, layernorm_backward_jvp, layernorm_forward,
                                       layernorm_jvp)

from ..exercise import Exercise
from .layernorm_jvp import cases


def _parameters(dy, dy_dot, xhat, xhat_dot):
    return (dy_dot * xhat + dy * xhat_dot).sum(axis=0), dy_dot.sum(axis=0)


def r_dot_term_forgotten(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True):
    """dx_dot lacks r_dot * (g - mean(g) - xhat m): dx = r * (...) is a product, and r moves too."""
    g, g_dot = dy * gamma, dy_dot * gamma + dy * gamma_dot
    m = (g * xhat).mean(axis=-1, keepdims=True)
    m_dot = (g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)
    dx_dot = r * (g_dot - g_dot.mean(axis=-1, keepdims=True) - xhat_dot * m - xhat * m_dot)
    return (dx_dot, *_parameters(dy, dy_dot, xhat, xhat_dot))


def xhat_dot_m_forgotten(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True):
    """dx_dot lacks - xhat_dot * m: the term xhat * m of the backward is a product of two things that move."""
    g, g_dot = dy * gamma, dy_dot * gamma + dy * gamma_dot
    m = (g * xhat).mean(axis=-1, keepdims=True)
    m_dot = (g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)
    dx_dot = (r_dot * (g - g.mean(axis=-1, keepdims=True) - xhat * m)
              + r * (g_dot - g_dot.mean(axis=-1, keepdims=True) - xhat * m_dot))
    return (dx_dot, *_parameters(dy, dy_dot, xhat, xhat_dot))


def gain_tangent_forgotten(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True):
    """g_dot = dy_dot * gamma lacks dy * gamma_dot: g = dy * gamma, and the gain moves too."""
    g, g_dot = dy * gamma, dy_dot * gamma
    m = (g * xhat).mean(axis=-1, keepdims=True)
    m_dot = (g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)
    dx_dot = (r_dot * (g - g.mean(axis=-1, keepdims=True) - xhat * m)
              + r * (g_dot - g_dot.mean(axis=-1, keepdims=True) - xhat_dot * m - xhat * m_dot))
    return (dx_dot, *_parameters(dy, dy_dot, xhat, xhat_dot))


def upstream_tangent_only(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True):
    """Only dy_dot carried through the backward (the backward applied to dy_dot): the tangents of xhat, r and gamma,
    what the forward's point moving changes in the backward, are missing: that is the Hessian's part."""
    dx_dot, _, _ = layernorm_backward(dy_dot, xhat, r, gamma)
    return dx_dot, (dy_dot * xhat).sum(axis=0), dy_dot.sum(axis=0)


def gain_gradient_tangent_without_xhat_dot(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True):
    """dgamma_dot = sum(dy_dot * xhat) lacks sum(dy * xhat_dot): dgamma = sum(dy * xhat), and xhat moves too."""
    g, g_dot = dy * gamma, dy_dot * gamma + dy * gamma_dot
    m = (g * xhat).mean(axis=-1, keepdims=True)
    m_dot = (g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)
    dx_dot = (r_dot * (g - g.mean(axis=-1, keepdims=True) - xhat * m)
              + r * (g_dot - g_dot.mean(axis=-1, keepdims=True) - xhat_dot * m - xhat * m_dot))
    return dx_dot, (dy_dot * xhat).sum(axis=0), dy_dot.sum(axis=0)


EXERCISE = Exercise(
    stage="forward mode", rank=2,
    equivalent={"minus of `-1` dropped": "mean(axis=1) is mean(axis=-1): the layer hands layernorm_backward_jvp 2-d "
                                         "(n, d) rows, whose axis 1 is the last one"},
    name="layernorm_rop", title="the tangent of LayerNorm's backward (the R-operator)",
    paper="Section 3.1; Pearlmutter 1994", target=layernorm_backward_jvp, layer=LayerNorm, cases=cases,
    outputs=("dx_dot", "dgamma_dot", "dbeta_dot"), mode="rop",
    show=(layernorm_forward, layernorm_backward, layernorm_jvp),
    names={"dy * gamma": "g", "(g * xhat).mean(axis=-1, keepdims=True)": "m",
           "(g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)": "m_dot"},
    symbols={"n": lambda a: a["dy"].shape[0], "d": lambda a: a["dy"].shape[-1]},
    mistakes=(r_dot_term_forgotten, xhat_dot_m_forgotten, gain_tangent_forgotten, upstream_tangent_only,
              gain_gradient_tangent_without_xhat_dot),
    notes="The layer flattens the leading axes into rows: dy, dy_dot, xhat and xhat_dot are (n, d), r and r_dot "
          "(n, 1), gamma and gamma_dot (d,). parameters is False when nobody reads the parameters' tangents: "
          "return None for those two then. Graded: every tensor's gradient tangent, against central differences "
          "of the backward (the point and the upstream gradient moved along their tangents) and numformer's own.",
    forward="""
        The tangent of a backward: run the backward, and beside each of its lines the tangent of that line, the
        derivative d/ds when the forward's point moves along the tangents (x along x_dot, gamma along gamma_dot)
        and the upstream gradient dy along dy_dot. When dy is the loss's gradient, the tangents of the parameters'
        gradients are the Hessian-vector product H v (Pearlmutter 1994). The backward you differentiate is shown
        below as layernorm_backward; with g = dxhat = dy * gamma (n, d) and m = mean(g * xhat) over the row:

            dgamma = sum over rows of dy * xhat
            dbeta  = sum over rows of dy
            dx     = r * (g - mean(g) - xhat * m)

        Your function receives dy and dy_dot (n, d), the forward's xhat (n, d) and r (n, 1), gamma (d,), what the
        layer's jvp computed, xhat_dot (n, d) and r_dot (n, 1), and gamma_dot (d,). It returns (dx_dot,
        dgamma_dot, dbeta_dot), the tangents of dx (n, d), dgamma (d,) and dbeta (d,).""",
    returns="Return (dx_dot, dgamma_dot, dbeta_dot): the tangents of dx (n, d), dgamma (d,) and dbeta (d,), from dy, "
            "dy_dot (n, d), xhat (n, d), r (n, 1), gamma (d,), xhat_dot (n, d), r_dot (n, 1), gamma_dot (d,).",
    steps=("The parameters' lines are sums of products: dgamma_dot = sum over rows of (dy_dot * xhat + dy * "
           "xhat_dot), dbeta_dot = sum over rows of dy_dot.",
           "g = dy * gamma: g_dot = dy_dot * gamma + dy * gamma_dot (both factors move).",
           "m = mean(g * xhat): m_dot = mean(g_dot * xhat + g * xhat_dot).",
           "dx = r * u with u = g - mean(g) - xhat * m: dx_dot = r_dot * u + r * u_dot, and u_dot = g_dot - "
           "mean(g_dot) - xhat_dot * m - xhat * m_dot (the last term of u is a product too).",
           "Together: dx_dot = r_dot * (g - mean(g) - xhat * m) + r * (g_dot - mean(g_dot) - xhat_dot * m - xhat * "
           "m_dot); return (dx_dot, dgamma_dot, dbeta_dot), the last two None when parameters is False."))
