"""ReLU, the activation of the position-wise feed-forward network (Eq. 2). Shapes: any -> same.

``y = max(0, x)``; ``dx = dy * [x > 0]`` (the gradient at exactly 0 is taken as 0,
as PyTorch does).
"""
from __future__ import annotations

from ..backend import get_array_module
from ..module import Module


def relu_forward(x):
    """-> (y, positive): y = max(0, x) and the active set [x > 0] that backward needs."""
    positive = x > 0
    return get_array_module(x).maximum(x, 0), positive


def relu_backward(dy, positive):
    """dx = dy * [x > 0]."""
    return dy * positive


class ReLU(Module):
    """``max(0, x)``; keeps the active set ``[x > 0]`` of a training forward for backward, readable
    as :attr:`active_set`."""

    def __init__(self):
        super().__init__()
        self._cache_positive = None

    def forward(self, x):
        y, positive = relu_forward(x)
        if self.training:
            self._cache_positive = positive
        return y

    @property
    def active_set(self):
        """The active set ``[x > 0]`` (bool, x's shape) of the last forward in training mode, until backward
        uses it; None otherwise. The finite-difference checks compare it between the two sides of a probe:
        when it differs, the probe straddles the kink at 0 and measures nothing (numformer.gradcheck.kinks)."""
        return self._cache_positive

    def backward(self, dy):
        dx = relu_backward(dy, self._cache_positive)
        self._cache_positive = None
        return dx
