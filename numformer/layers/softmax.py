"""Softmax over the last axis (the attention weights of Eq. 1).

``y_i = exp(x_i - max_j x_j) / sum_k exp(x_k - max_j x_j)``: subtracting the row
maximum changes nothing mathematically and keeps ``exp`` from overflowing.

Backward, from ``dy_i/dx_j = y_i (delta_ij - y_j)``:
``dx = y * (dy - sum(dy * y))``, the sum over the last axis: never the (n, n)
Jacobian of each row. Shapes: any (..., n) -> same.

Forward mode, the same Jacobian applied to a tangent (it is symmetric): ``y_dot = y * (x_dot - sum(x_dot * y))``.
The backward's tangent (Pearlmutter's R-operator), with ``c = sum(dy * y)``:
``dx_dot = y_dot * (dy - c) + y * (dy_dot - c_dot)``, ``c_dot = sum(dy_dot * y + dy * y_dot)``.
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


def softmax_jvp(x_dot, y):
    """y_dot = y * (x_dot - sum(x_dot * y)), over the last axis."""
    return y * (x_dot - (x_dot * y).sum(axis=-1, keepdims=True))


def softmax_backward_jvp(dy, dy_dot, y, y_dot):
    """The tangent of softmax_backward: dx_dot = y_dot * (dy - c) + y * (dy_dot - c_dot), c = sum(dy * y)."""
    c = (dy * y).sum(axis=-1, keepdims=True)
    c_dot = (dy_dot * y + dy * y_dot).sum(axis=-1, keepdims=True)
    return y_dot * (dy - c) + y * (dy_dot - c_dot)
