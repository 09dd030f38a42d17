"""Layer normalisation (Ba et al. 2016), used in every residual sub-layer (Section 3.1).

Over the last axis of x (..., d), with the biased variance:
``mu = mean(x)``; ``r = 1 / sqrt(mean((x - mu)^2) + eps)``; ``xhat = (x - mu) * r``;
``y = xhat * gamma + beta``.

Backward:
``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` (over every row);
``dxhat = dy * gamma``; ``dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``.
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


@registered
class LayerNorm(Module):
    """Normalise the last axis, then scale and shift (gain 1, bias 0 at start).
    Saved for backward: ``xhat`` (n, d) and ``r`` (n, 1), the input's rows normalised and their 1 / std."""

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
