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


def _scale_rows(x, mask, out, add=None):
    """``out = x * mask (+ add)``, blocked over rows in host threads (out may be x)."""
    xp = get_array_module(x)
    lead = (-1, x.shape[-1]) if x.ndim > 1 else (-1, 1)
    arrays = [x.reshape(lead), mask.reshape(lead), out.reshape(lead)]
    if add is not None:
        arrays.append(add.reshape(lead))

    def block(xb, mb, ob, ab=None):
        xp.multiply(xb, mb, out=ob)
        if ab is not None:
            ob += ab

    parallel_rows(block, *arrays, chunk_elements=1 << 15)
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
                np.multiply(xf[lo:hi], block, out=of[lo:hi])
                if af is not None:
                    of[lo:hi] += af[lo:hi]

            self._cache_mask = self.rng.dropout_mask(x.shape, self.p, x.dtype, then=apply)
            return out
        mask = self.rng.dropout_mask(x.shape, self.p, x.dtype)
        self._cache_mask = mask
        if x.flags.c_contiguous and mask.flags.c_contiguous and (add is None or add.shape == x.shape):
            return _scale_rows(x, mask, x if inplace else xp.empty_like(x),
                               None if add is None else xp.ascontiguousarray(add))
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
