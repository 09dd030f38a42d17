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

from ..module import Module


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

    def forward(self, x):
        if not self.active():
            self._cache_mask = None
            return x
        if self.rng is None:
            raise ValueError("Dropout with p > 0 needs a RandomState (rng=...)")
        mask = self.rng.dropout_mask(x.shape, self.p, x.dtype)
        self._cache_mask = mask
        return x * mask

    def backward(self, dy):
        mask = self._cache_mask
        self._cache_mask = None
        return dy if mask is None else dy * mask
