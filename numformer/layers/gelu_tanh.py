"""GELU in its tanh form (Hendrycks and Gimpel 2016, Section 2's approximation): the activation of GPT-2's
feed-forward network, transformers' ``gelu_new`` and ``gelu_pytorch_tanh``, PyTorch's
``F.gelu(approximate="tanh")`` (Eq. 2 with ``max(0, .)`` replaced). Shapes: any -> same.

``y = x * g`` with the gate ``g = (1 + tanh(u)) / 2 = sigmoid(2u)``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``;
``dx = dy * (g + x * 2 g (1 - g) du/dx)`` (the product rule, with ``dg/dx = 2 g (1 - g) du/dx``, the
sigmoid's derivative, and ``du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)``).
Forward mode: ``y_dot = x_dot * (g + x * dg/dx)``. The backward's tangent adds the second derivative,
``d2y/dx2 = 2 dg/dx + x d2g/dx2`` with ``d2g/dx2 = 2 (1 - 2 g) dg/dx du/dx + 2 g (1 - g) d2u/dx2`` and
``d2u/dx2 = 6 * 0.044715 sqrt(2/pi) x``: ``dx_dot = dy_dot * y' + dy * y'' * x_dot``.

The gate is the sigmoid of :mod:`numformer.layers.silu` (no overflow, and accurate where ``1 + tanh`` would
cancel). Smooth: no kink, no active set. The exact form is :mod:`numformer.layers.gelu`.
"""
from __future__ import annotations

import math

from ..module import Module
from .silu import sigmoid

C = math.sqrt(2 / math.pi)
K = 0.044715


def gelu_tanh_forward(x):
    """-> (y, g): y = x * g with the gate g = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    g = sigmoid(2 * C * (x + K * x * x * x))
    return x * g, g


def gelu_tanh_backward(dy, x, gate):
    """du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2); dg/dx = 2 g (1 - g) du/dx; dx = dy * (g + x * dg/dx)."""
    du = C * (1 + 3 * K * x * x)           # du/dx
    dg = 2 * gate * (1 - gate) * du        # the sigmoid's derivative through 2u
    return dy * (gate + x * dg)            # the product rule: d(x * g)/dx = g + x * dg/dx


def gelu_tanh_jvp(x_dot, x, gate):
    """y_dot = x_dot * (g + x * dg/dx), dg/dx = 2 g (1 - g) du/dx."""
    return x_dot * (gate + x * 2 * gate * (1 - gate) * C * (1 + 3 * K * x * x))


def gelu_tanh_backward_jvp(dy, dy_dot, x, gate, x_dot):
    """The tangent of gelu_tanh_backward: dx_dot = dy_dot * y' + dy * y'' * x_dot, y'' = 2 g' + x g''."""
    du = C * (1 + 3 * K * x * x)                                      # du/dx
    dg = 2 * gate * (1 - gate) * du                                   # dg/dx
    d2g = 2 * (1 - 2 * gate) * dg * du + 2 * gate * (1 - gate) * 6 * C * K * x   # d2g/dx2
    return dy_dot * (gate + x * dg) + dy * (2 * dg + x * d2g) * x_dot


class GELUTanh(Module):
    """``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))``. Saved for backward: ``x`` and ``gate``; by jvp: ``x``,
    its tangent."""

    kinks = False  # smooth: no active set

    def forward(self, x):
        y, gate = gelu_tanh_forward(x)
        self.save_for_backward(x=x, gate=gate)
        return y

    def backward(self, dy):
        x, gate = self.pop_saved("x", "gate")
        return gelu_tanh_backward(dy, x, gate)

    def jvp(self, x_dot):
        x, gate = self.peek_saved("x", "gate")
        self.save_tangents(x=x_dot)
        return gelu_tanh_jvp(x_dot, x, gate)

    def backward_jvp(self, dy, dy_dot):
        (x, gate), x_dot = self.peek_saved("x", "gate"), self.pop_tangents("x")
        dx_dot = gelu_tanh_backward_jvp(dy, dy_dot, x, gate, x_dot)  # before the backward, which frees x, gate
        return self.backward(dy), dx_dot
