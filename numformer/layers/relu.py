"""ReLU, the activation of the position-wise feed-forward network (Eq. 2). Shapes: any -> same."""
from __future__ import annotations

from ..backend import get_array_module, parallel_rows
from ..module import Module

RELU_BLOCK = 1 << 15  # elements per block of the threaded in-place passes


def _rows(a):
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(-1, 1)


def relu_(x, record=None):
    """``max(x, 0)`` in place on x (which nobody else may hold); returns x.

    ``record``: a :class:`ReLU` whose ``_cache_positive`` receives ``x > 0`` (bool) for
    backward. Blocked over rows in host threads.
    """
    xp = get_array_module(x)
    if not x.flags.c_contiguous:
        if record is not None:
            record._cache_positive = x > 0
        return xp.maximum(x, 0, out=x)
    x2 = _rows(x)
    positive = xp.empty(x2.shape, dtype=bool) if record is not None else None
    zero = xp.asarray(0, dtype=x.dtype)

    def block(xb, pb=None):
        if pb is not None:
            xp.greater(xb, zero, out=pb)
        xp.maximum(xb, zero, out=xb)

    parallel_rows(block, *([x2] if positive is None else [x2, positive]), chunk_elements=RELU_BLOCK)
    if record is not None:
        record._cache_positive = positive.reshape(x.shape)
    return x


def relu_backward_(dy, positive):
    """``dy * positive`` in place on dy (a fresh gradient nobody else holds); returns dy."""
    xp = get_array_module(dy)
    if not (dy.flags.c_contiguous and positive.flags.c_contiguous):
        dy *= positive
        return dy
    parallel_rows(lambda a, b: xp.multiply(a, b, out=a), _rows(dy), _rows(positive), chunk_elements=RELU_BLOCK)
    return dy


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
