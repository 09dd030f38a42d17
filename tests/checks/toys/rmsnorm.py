"""RMS normalisation (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization"), a norm that stands in
LayerNorm's place in every residual sub-layer (Section 3.1): no mean taken off, no bias.

Over the last axis of x (..., d): ``r = 1 / sqrt(mean(x^2) + eps)``; ``xhat = x * r``; ``y = xhat * gamma``.

Backward: ``dgamma = sum(dy * xhat)`` (over every row); ``dxhat = dy * gamma``;
``dx = r * (dxhat - xhat * mean(dxhat * xhat))``. Shapes: x (..., d) -> y (..., d).
"""
from __future__ import annotations

import numpy as np

from numformer.backend import DEFAULT_DTYPE, get_array_module
from numformer.module import Module, Parameter


def rmsnorm_forward(x, gamma, eps: float):
    """x (n, d) -> (y, xhat, r): y = xhat * gamma, xhat = x * r, r = 1 / sqrt(mean(x^2) + eps) (n, 1)."""
    xp = get_array_module(x)
    r = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * r
    return xhat * gamma, xhat, r


def rmsnorm_backward(dy, xhat, r, gamma):
    """dy (n, d) -> (dx, dgamma)."""
    dgamma = (dy * xhat).sum(axis=0)
    dxhat = dy * gamma
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma


class ToyRMSNorm(Module):
    """Scale the last axis to unit root mean square, then by a gain (1 at start).
    Saved for backward: ``xhat`` (n, d) and ``r`` (n, 1)."""

    kinks = False  # smooth for mean(x^2) + eps > 0 (Module.kinks: the layer contract)

    def __init__(self, d: int, eps: float = 1e-5, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.d, self.eps = d, float(eps)
        self.weight = Parameter(np.ones(d, dtype=dtype))   # gamma

    def forward(self, x):
        """x (..., d) -> y (..., d)."""
        y, xhat, r = rmsnorm_forward(x.reshape(-1, self.d), self.weight.data, self.eps)
        self.save_for_backward(xhat=xhat, r=r)
        return y.reshape(x.shape)

    def backward(self, dy):
        xhat, r = self.pop_saved("xhat", "r")
        dx, dgamma = rmsnorm_backward(dy.reshape(-1, self.d), xhat, r, self.weight.data)
        self.weight.grad += dgamma
        return dx.reshape(dy.shape)
