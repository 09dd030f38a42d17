"""Mish (Misra 2019), an activation of the feed-forward network in place of Eq. 2's ``max(0, .)``.
Shapes: any -> same.

``y = x * g`` with ``g = tanh(softplus(x))``, ``softplus(x) = log(1 + exp(x))``;
``dx = dy * (g + x * (1 - g^2) * sigmoid(x))`` (the product rule; softplus' derivative is the sigmoid).
"""
from __future__ import annotations

from numformer.backend import get_array_module
from numformer.module import Module


def mish_toy_forward(x):
    """-> (y, g): y = x * g with g = tanh(softplus(x)), softplus as max(x, 0) + log1p(exp(-|x|)) (no overflow)."""
    xp = get_array_module(x)
    g = xp.tanh(xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))))
    return x * g, g


def mish_toy_backward(dy, x, gate):
    """dg/dx = (1 - g^2) * sigmoid(x); dx = dy * (g + x * dg/dx)."""
    xp = get_array_module(x)
    e = xp.exp(-xp.abs(x))
    s = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))  # sigmoid(x), without overflow
    return dy * (gate + x * (1 - gate * gate) * s)


class ToyMish(Module):
    """``x * tanh(softplus(x))``. Saved for backward: ``x`` and ``gate``."""

    kinks = False  # smooth (Module.kinks: the layer contract)

    def forward(self, x):
        y, g = mish_toy_forward(x)
        self.save_for_backward(x=x, gate=g)
        return y

    def backward(self, dy):
        x, g = self.pop_saved("x", "gate")
        return mish_toy_backward(dy, x, g)
