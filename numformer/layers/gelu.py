"""GELU, the Gaussian error linear unit (Hendrycks and Gimpel 2016, Section 2), in its exact form: the
activation of the feed-forward network in BERT-style models, transformers' ``gelu`` (Eq. 2 with
``max(0, .)`` replaced). Shapes: any -> same.

``y = x * g`` with the gate ``g = Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the standard normal's distribution
function; ``dx = dy * (g + x * phi(x))`` (the product rule, with ``dPhi/dx = phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``,
the standard normal's density).

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


class GELU(Module):
    """``x * Phi(x)``. Saved for backward: ``x`` and ``gate``, the input and Phi(x)."""

    kinks = False  # smooth: no active set

    def forward(self, x):
        y, gate = gelu_forward(x)
        self.save_for_backward(x=x, gate=gate)
        return y

    def backward(self, dy):
        x, gate = self.pop_saved("x", "gate")
        return gelu_backward(dy, x, gate)
