"""Layer normalisation (Ba et al. 2016), used in every residual sub-layer (Section 3.1).

Over the last axis of x (..., d), with the biased variance:
``mu = mean(x)``; ``r = 1 / sqrt(mean((x - mu)^2) + eps)``; ``xhat = (x - mu) * r``;
``y = xhat * gamma + beta``.

Backward:
``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` (over every row);
``dxhat = dy * gamma``; ``dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``.

Forward mode (tangents ``x_dot``, ``gamma_dot``, ``beta_dot``; numformer/forward_mode.py), from
``d var = 2 mean((x - mu) x_dot)`` and ``dr = -r^3 mean((x - mu) x_dot)``:
``r_dot = -r^2 mean(xhat * x_dot)``; ``xhat_dot = r * (x_dot - mean(x_dot) - xhat * mean(xhat * x_dot))`` (the
backward's formula: xhat's Jacobian is symmetric); ``y_dot = xhat_dot * gamma + xhat * gamma_dot + beta_dot``.

The backward's tangent (Pearlmutter's R-operator; ``dy_dot`` the upstream gradient's), line by line of the
backward with ``g = dxhat`` and ``m = mean(g * xhat)``:
``dgamma_dot = sum(dy_dot * xhat + dy * xhat_dot)``; ``dbeta_dot = sum(dy_dot)``;
``g_dot = dy_dot * gamma + dy * gamma_dot``; ``m_dot = mean(g_dot * xhat + g * xhat_dot)``;
``dx_dot = r_dot * (g - mean(g) - xhat * m) + r * (g_dot - mean(g_dot) - xhat_dot * m - xhat * m_dot)``.
Shapes: x (..., d) -> y (..., d).
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module
from ..kernels import kernel
from ..module import Module, Parameter
from .registry import registered


def layernorm_forward(x, gamma, beta, eps: float):
    """x (n, d) -> (y, xhat, r): y = xhat * gamma + beta, xhat = (x - mu) * r, r (n, 1)."""
    xp = get_array_module(x)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    r = 1.0 / xp.sqrt(var + eps)
    xhat = (x - mu) * r
    return xhat * gamma + beta, xhat, r


def layernorm_backward(dy, xhat, r, gamma):
    """dy (n, d) -> (dx, dgamma, dbeta)."""
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def layernorm_jvp(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """x_dot (n, d) -> (y_dot, xhat_dot, r_dot), the tangents of y, xhat (n, d) and r (n, 1); gamma_dot, beta_dot
    (d,) None where zero."""
    r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
    xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True) - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
    y_dot = xhat_dot * gamma
    if gamma_dot is not None:
        y_dot = y_dot + xhat * gamma_dot
    return (y_dot if beta_dot is None else y_dot + beta_dot), xhat_dot, r_dot


def layernorm_backward_jvp(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters: bool = True):
    """The tangent of layernorm_backward -> (dx_dot (n, d), dgamma_dot (d,), dbeta_dot (d,)); gamma_dot None where
    zero; the parameters' two None unless ``parameters``."""
    dgamma_dot = (dy_dot * xhat + dy * xhat_dot).sum(axis=0) if parameters else None
    dbeta_dot = dy_dot.sum(axis=0) if parameters else None
    g, g_dot = dy * gamma, dy_dot * gamma
    if gamma_dot is not None:
        g_dot = g_dot + dy * gamma_dot
    m = (g * xhat).mean(axis=-1, keepdims=True)
    m_dot = (g_dot * xhat + g * xhat_dot).mean(axis=-1, keepdims=True)
    dx_dot = (r_dot * (g - g.mean(axis=-1, keepdims=True) - xhat * m)
              + r * (g_dot - g_dot.mean(axis=-1, keepdims=True) - xhat_dot * m - xhat * m_dot))
    return dx_dot, dgamma_dot, dbeta_dot


@registered
class LayerNorm(Module):
    """Normalise the last axis, then scale and shift (gain 1, bias 0 at start).
    Saved for backward: ``xhat`` (n, d) and ``r`` (n, 1), the input's rows normalised and their 1 / std;
    by jvp: ``xhat`` and ``r``, their tangents."""

    kinks = False  # smooth for var + eps > 0 (Module.kinks: the layer contract)

    def __init__(self, d: int, eps: float = 1e-5, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.d, self.eps = d, float(eps)
        self.weight = Parameter(np.ones(d, dtype=dtype))   # gamma
        self.bias = Parameter(np.zeros(d, dtype=dtype))    # beta

    def forward(self, x):
        """x (..., d) -> y (..., d)."""
        y, xhat, r = kernel(layernorm_forward)(x.reshape(-1, self.d), self.weight.data, self.bias.data, self.eps)
        self.save_for_backward(xhat=xhat, r=r)
        return y.reshape(x.shape)

    def backward(self, dy):
        xhat, r = self.pop_saved("xhat", "r")
        dx, dgamma, dbeta = kernel(layernorm_backward)(dy.reshape(-1, self.d), xhat, r, self.weight.data)
        self.weight.grad += dgamma
        self.bias.grad += dbeta
        return dx.reshape(dy.shape)

    def jvp(self, x_dot):
        """x_dot (..., d) -> y_dot (..., d), with gamma's and beta's tangents."""
        xhat, r = self.peek_saved("xhat", "r")
        y_dot, xhat_dot, r_dot = layernorm_jvp(x_dot.reshape(-1, self.d), xhat, r, self.weight.data,
                                               self.weight.nonzero_tangent, self.bias.nonzero_tangent)
        self.save_tangents(xhat=xhat_dot, r=r_dot)
        return y_dot.reshape(x_dot.shape)

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot); adds dgamma, dbeta into the gradients and their tangents into grad_tangent."""
        (xhat, r), (xhat_dot, r_dot) = self.peek_saved("xhat", "r"), self.pop_tangents("xhat", "r")
        wanted = self.weight.wants_grad_tangent or self.bias.wants_grad_tangent
        dx_dot, dgamma_dot, dbeta_dot = layernorm_backward_jvp(dy.reshape(-1, self.d), dy_dot.reshape(-1, self.d),
                                                               xhat, r, self.weight.data, xhat_dot, r_dot,
                                                               self.weight.nonzero_tangent, wanted)
        if wanted:
            self.weight.grad_tangent += dgamma_dot
            self.bias.grad_tangent += dbeta_dot
        return self.backward(dy), dx_dot.reshape(dy.shape)
