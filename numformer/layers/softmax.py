"""Softmax over the last axis (the attention weights of Eq. 1).

Forward subtracts the row maximum for stability. Backward uses the closed form
``dx = y * (dy - sum(dy * y, axis=-1))``: never the (T, T) Jacobian per row.
Shapes: any (..., n) -> same.
"""
from __future__ import annotations

from ..backend import get_array_module
from ..module import Module


def softmax(x, axis: int = -1):
    """Numerically stable softmax of x along ``axis`` (a new array)."""
    xp = get_array_module(x)
    y = x - x.max(axis=axis, keepdims=True)
    xp.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)
    return y


def softmax_(x):
    """Softmax along the last axis *in place* (x is overwritten with the result); returns x."""
    xp = get_array_module(x)
    x -= x.max(axis=-1, keepdims=True)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def softmax_backward_(dy, y):
    """``dy <- y * (dy - sum(dy * y, axis=-1))`` in place (dy is overwritten); returns dy."""
    s = (dy * y).sum(axis=-1, keepdims=True)
    dy -= s
    dy *= y
    return dy


class Softmax(Module):
    """Softmax along the last axis, caching its output for backward."""

    def __init__(self):
        super().__init__()
        self._cache_y = None

    def forward(self, x):
        y = softmax(x, axis=-1)
        if self.training:
            self._cache_y = y
        return y

    def backward(self, dy):
        y = self._cache_y
        self._cache_y = None
        dx = dy - (dy * y).sum(axis=-1, keepdims=True)
        dx *= y
        return dx
