"""ReLU, the activation of the position-wise feed-forward network (Eq. 2). Shapes: any -> same."""
from __future__ import annotations

from ..backend import get_array_module
from ..module import Module


class ReLU(Module):
    """``max(0, x)``; the gradient at exactly 0 is taken as 0 (as PyTorch does)."""

    def __init__(self):
        super().__init__()
        self._cache_positive = None

    def forward(self, x):
        xp = get_array_module(x)
        if self.training:
            self._cache_positive = x > 0
        return xp.maximum(x, 0)

    def backward(self, dy):
        positive = self._cache_positive
        self._cache_positive = None
        return dy * positive
