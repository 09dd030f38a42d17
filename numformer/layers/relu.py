"""ReLU, the activation of the position-wise feed-forward network (Eq. 2). Shapes: any -> same.

``y = max(0, x)``; ``dx = dy * [x > 0]`` (the gradient at exactly 0 is taken as 0,
as PyTorch does).
"""
from __future__ import annotations

from ..backend import get_array_module
from ..kernels import kernel
from ..module import Module


def relu_forward(x):
    """-> (y, positive): y = max(0, x) and the active set [x > 0] that backward needs."""
    positive = x > 0
    return get_array_module(x).maximum(x, 0), positive


def relu_backward(dy, positive):
    """dx = dy * [x > 0]."""
    return dy * positive


class ReLU(Module):
    """``max(0, x)``. Saved for backward: ``positive``, the active set ``[x > 0]`` (also :attr:`active_set`)."""

    def forward(self, x):
        y, positive = kernel(relu_forward)(x)
        self.save_for_backward(positive=positive)
        return y

    @property
    def active_set(self):
        """The active set ``[x > 0]`` (bool, x's shape) of the last forward in training mode, until backward
        uses it; None otherwise. The finite-difference checks compare it between the two sides of a probe:
        when it differs, the probe straddles the kink at 0 and measures nothing (numformer.finite_differences.kinks)."""
        return self.saved.get("positive")

    def backward(self, dy):
        return kernel(relu_backward)(dy, self.pop_saved("positive"))
