"""Layer normalisation (Ba et al. 2016), used in every residual sub-layer (Section 3.1).

``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axis, with the
biased variance. Shapes: x (..., d) -> y (..., d).

Backward, with xhat the normalised input and r = 1/sqrt(var + eps):
``dxhat = dy * weight``;
``dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``.
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module
from ..module import Module, Parameter


class LayerNorm(Module):
    """Normalise the last axis, then scale and shift (gain 1, bias 0 at start)."""

    def __init__(self, d: int, eps: float = 1e-5, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.d, self.eps = d, float(eps)
        self.weight = Parameter(np.ones(d, dtype=dtype))
        self.bias = Parameter(np.zeros(d, dtype=dtype))
        self._cache_xhat = None
        self._cache_rstd = None

    def forward(self, x):
        xp = get_array_module(x)
        mean = x.mean(axis=-1, keepdims=True)
        xc = x - mean
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + self.eps)
        xhat = xc
        xhat *= rstd
        y = xhat * self.weight.data
        y += self.bias.data
        if self.training:
            self._cache_xhat, self._cache_rstd = xhat, rstd
        return y

    def backward(self, dy):
        xhat, rstd = self._cache_xhat, self._cache_rstd
        d = self.d
        lead_axes = tuple(range(dy.ndim - 1))
        self.weight.grad += (dy * xhat).sum(axis=lead_axes)
        self.bias.grad += dy.sum(axis=lead_axes)
        dxhat = dy * self.weight.data
        mean_dxhat = dxhat.sum(axis=-1, keepdims=True) / d
        mean_dxhat_xhat = (dxhat * xhat).sum(axis=-1, keepdims=True) / d
        dx = dxhat
        dx -= mean_dxhat
        dx -= xhat * mean_dxhat_xhat
        dx *= rstd
        self._cache_xhat = self._cache_rstd = None
        return dx
