"""GELU, the Gaussian error linear unit (Hendrycks and Gimpel 2016, Section 2), in its exact form: the
activation of the feed-forward network in BERT-style models, transformers' ``gelu`` (Eq. 2 with
``max(0, .)`` replaced). Shapes: any -> same.

``y = x * g`` with the gate ``g = Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the standard normal's distribution
function; ``dx = dy * (g + x * phi(x))`` (the product rule, with ``dPhi/dx = phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``,
the standard normal's density). Forward mode: ``y_dot = x_dot * (g + x * phi(x))``; the backward's tangent
adds the second derivative, ``d2y/dx2 = 2 phi(x) + x phi'(x) = phi(x) (2 - x^2)`` (``phi' = -x phi``):
``dx_dot = dy_dot * y' + dy * y'' * x_dot``.

The gate is computed as ``erfc(-x / sqrt 2) / 2`` (:mod:`numformer.layers.erf`, the same function): for
x below -2 sqrt 2 it keeps its relative accuracy where ``1 + erf`` would cancel to 0; between there and 0 it
is accurate to a few ulp(1), absolute. Smooth: no kink, no active set.
"""
from __future__ import annotations

import math

from ..backend import get_array_module
from ..module import Module
from .erf import erfc

SQRT_HALF = math.sqrt(0.5)
SQRT_2PI = math.sqrt(2 * math.pi)


def normal_cdf(x):
    """g = Phi(x) = (1 + erf(x / sqrt 2)) / 2, computed as erfc(-x / sqrt 2) / 2; x's shape and dtype."""
    return 0.5 * erfc(-SQRT_HALF * x)


def gelu_forward(x):
    """-> (y, g): y = x * g with the gate g = Phi(x), which backward needs too."""
    g = normal_cdf(x)
    return x * g, g


def gelu_backward(dy, x, gate):
    """dPhi/dx = phi(x) = exp(-x^2 / 2) / sqrt(2 pi); dx = dy * (g + x * phi(x))."""
    xp = get_array_module(x)
    density = xp.exp(-0.5 * x * x) / SQRT_2PI  # phi(x), the gate's derivative
    return dy * (gate + x * density)           # the product rule: d(x * g)/dx = g + x * dg/dx


def gelu_jvp(x_dot, x, gate):
    """y_dot = x_dot * (g + x * phi(x)), dy/dx times the tangent."""
    xp = get_array_module(x)
    return x_dot * (gate + x * xp.exp(-0.5 * x * x) / SQRT_2PI)


def gelu_backward_jvp(dy, dy_dot, x, gate, x_dot):
    """The tangent of gelu_backward: dx_dot = dy_dot * y' + dy * y'' * x_dot, y'' = phi(x) (2 - x^2)."""
    xp = get_array_module(x)
    density = xp.exp(-0.5 * x * x) / SQRT_2PI   # phi(x)
    return dy_dot * (gate + x * density) + dy * density * (2 - x * x) * x_dot


class GELU(Module):
    """``x * Phi(x)``. Saved for backward: ``x`` and ``gate``, the input and Phi(x); by jvp: ``x``, its tangent."""

    kinks = False  # smooth: no active set

    def forward(self, x):
        y, gate = gelu_forward(x)
        self.save_for_backward(x=x, gate=gate)
        return y

    def backward(self, dy):
        x, gate = self.pop_saved("x", "gate")
        return gelu_backward(dy, x, gate)

    def jvp(self, x_dot):
        x, gate = self.peek_saved("x", "gate")
        self.save_tangents(x=x_dot)
        return gelu_jvp(x_dot, x, gate)

    def backward_jvp(self, dy, dy_dot):
        (x, gate), x_dot = self.peek_saved("x", "gate"), self.pop_tangents("x")
        dx_dot = gelu_backward_jvp(dy, dy_dot, x, gate, x_dot)  # before the backward, which frees x and the gate
        return self.backward(dy), dx_dot
