"""Dropout (Section 5.4: on every sub-layer output and on embeddings + positions).

Inverted dropout: in training, each element is kept with probability 1 - p and
scaled by 1/(1 - p), so evaluation is the identity. (On the CPU the drop
probability is p rounded to a multiple of 2**-16 and the scale uses that value:
see :meth:`~numformer.backend.RandomState.dropout_mask`.) Masks come from the model's
single :class:`~numformer.backend.RandomState`, so a seed reproduces a run and
a gradient check can replay the same mask by restoring the generator state.
Shapes: any -> same.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, parallel_rows
from ..module import Module


def _multiply_add(xb, mb, ob, ab=None):
    """``ob = xb * mb (+ ab)`` on one block (ob may be xb)."""
    get_array_module(xb).multiply(xb, mb, out=ob)
    if ab is not None:
        ob += ab


def _scale_rows(x, mask, out):
    """``out = x * mask``, blocked over rows in host threads (out may be x)."""
    lead = (-1, x.shape[-1]) if x.ndim > 1 else (-1, 1)
    parallel_rows(_multiply_add, x.reshape(lead), mask.reshape(lead), out.reshape(lead), chunk_elements=1 << 15)
    return out


class Dropout(Module):
    """Zero elements with probability ``p`` in training mode; identity in eval mode or when p = 0."""

    def __init__(self, p: float, rng=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = rng
        self._cache_mask = None

    def active(self) -> bool:
        return self.training and self.p > 0.0

    def forward(self, x, inplace: bool = False, add=None):
        """x (any shape) -> dropout(x) (+ ``add``).

        ``inplace``: write the result into x (only for an x nobody else holds, such as a
        sub-layer's fresh output). ``add``: an array of x's shape added to the result in
        the same pass (the residual connection); it is not modified.
        """
        xp = get_array_module(x)
        if not self.active():
            self._cache_mask = None
            if add is None:
                return x
            if inplace:
                x += add
                return x
            return x + add
        if self.rng is None:
            raise ValueError("Dropout with p > 0 needs a RandomState (rng=...)")
        if xp is np and x.flags.c_contiguous and (add is None or add.shape == x.shape):
            # host: each block of the mask is applied in the thread that drew it, while in cache
            out = x if inplace else np.empty_like(x)
            xf, of = x.reshape(-1), out.reshape(-1)
            af = None if add is None else np.ascontiguousarray(add).reshape(-1)

            def apply(lo, hi, block):
                _multiply_add(xf[lo:hi], block, of[lo:hi], None if af is None else af[lo:hi])

            self._cache_mask = self.rng.dropout_mask(x.shape, self.p, x.dtype, then=apply)
            return out
        # the GPU (its own kernels, one per op) and strided or broadcast operands on the host
        mask = self.rng.dropout_mask(x.shape, self.p, x.dtype)
        self._cache_mask = mask
        out = x.__imul__(mask) if inplace else x * mask
        if add is not None:
            out += add
        return out

    def backward(self, dy):
        mask = self._cache_mask
        self._cache_mask = None
        if mask is None:
            return dy
        xp = get_array_module(dy)
        if dy.flags.c_contiguous:
            return _scale_rows(dy, mask, xp.empty_like(dy))
        return dy * mask
