"""SiLU ("swish"), the activation of the feed-forward network in Marian's opus-mt models (Eq. 2 with
``max(0, .)`` replaced; Elfwing et al. 2018, Ramachandran et al. 2017). Shapes: any -> same.

``y = x * s`` with ``s = sigmoid(x) = 1 / (1 + exp(-x))``;
``dx = dy * (s + x * s * (1 - s))`` (the product rule, with ``ds/dx = s * (1 - s)``).
Forward mode: ``y_dot = x_dot * (s + x * s * (1 - s))``. The backward's tangent adds the second derivative,
``d2y/dx2 = s (1 - s) (2 + x (1 - 2 s))`` (``d/dx [s (1 - s)] = s (1 - s) (1 - 2 s)``):
``dx_dot = dy_dot * y' + dy * y'' * x_dot``.

The sigmoid is computed without overflow for any x: with ``e = exp(-|x|)`` (at most 1),
``s = 1 / (1 + e)`` for x >= 0 and ``s = e / (1 + e)`` for x < 0; for large |x| e underflows to 0
quietly, which gives s = 1 or 0 exactly. Unlike ReLU it is smooth: no kink, no active set.
"""
from __future__ import annotations

from ..backend import get_array_module
from ..module import Module


def sigmoid(x):
    """s = 1 / (1 + exp(-x)), as 1 / (1 + e) where x >= 0 and e / (1 + e) where x < 0, with e = exp(-|x|) <= 1
    (no overflow in float32 or float64); x's shape and dtype."""
    xp = get_array_module(x)
    e = xp.exp(-xp.abs(x))
    r = 1 / (1 + e)
    return xp.where(x >= 0, r, e * r)


def silu_forward(x):
    """-> (y, s): y = x * s with s = sigmoid(x), which backward needs too."""
    s = sigmoid(x)
    return x * s, s


def silu_backward(dy, x, s):
    """ds/dx = s * (1 - s); dx = dy * (s + x * ds/dx) = dy * (s + x * s * (1 - s))."""
    ds = s * (1 - s)          # the sigmoid's derivative
    return dy * (s + x * ds)  # the product rule: d(x * s)/dx = s + x * ds/dx


def silu_jvp(x_dot, x, s):
    """y_dot = x_dot * (s + x * s * (1 - s)), dy/dx times the tangent."""
    return x_dot * (s + x * s * (1 - s))


def silu_backward_jvp(dy, dy_dot, x, s, x_dot):
    """The tangent of silu_backward: dx_dot = dy_dot * y' + dy * y'' * x_dot, y'' = s (1 - s) (2 + x (1 - 2 s))."""
    ds = s * (1 - s)                    # the sigmoid's derivative
    d2y = ds * (2 + x * (1 - 2 * s))    # d/dx of s + x * ds
    return dy_dot * (s + x * ds) + dy * d2y * x_dot


class SiLU(Module):
    """``x * sigmoid(x)``. Saved for backward: ``x`` and ``s``, the input and its sigmoid; by jvp: ``x``, its
    tangent."""

    kinks = False  # x * sigmoid(x): smooth (Module.kinks: the layer contract)

    def forward(self, x):
        y, s = silu_forward(x)
        self.save_for_backward(x=x, s=s)
        return y

    def backward(self, dy):
        x, s = self.pop_saved("x", "s")
        return silu_backward(dy, x, s)

    def jvp(self, x_dot):
        x, s = self.peek_saved("x", "s")
        self.save_tangents(x=x_dot)
        return silu_jvp(x_dot, x, s)

    def backward_jvp(self, dy, dy_dot):
        (x, s), x_dot = self.peek_saved("x", "s"), self.pop_tangents("x")
        dx_dot = silu_backward_jvp(dy, dy_dot, x, s, x_dot)  # before the backward, which frees x and s
        return self.backward(dy), dx_dot
