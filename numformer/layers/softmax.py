"""Softmax over the last axis (the attention weights of Eq. 1).

``y_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)``: subtracting the row
maximum changes nothing mathematically and keeps ``exp`` from overflowing.

Backward, from ``dy_i/dx_j = y_i (delta_ij - y_j)``:
``dx = y * (dy - sum(dy * y))``, the sum over the last axis: never the (n, n)
Jacobian of each row. Shapes: any (..., n) -> same.
"""
from __future__ import annotations

from ..backend import get_array_module


def softmax(x):
    """y = exp(x - max x) / sum exp(x - max x), over the last axis."""
    xp = get_array_module(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(dy, y):
    """dx = y * (dy - sum(dy * y)), over the last axis."""
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))
