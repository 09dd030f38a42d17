"""Dropout (Section 5.4: on every sub-layer output and on embeddings + positions).

Inverted dropout: in training each element is kept with probability ``1 - p`` and
scaled by ``1 / (1 - p)``, so evaluation is the identity:
``y = x * m``, ``m_i = [u_i >= p] / (1 - p)``, ``u_i`` uniform in [0, 1);
backward ``dx = dy * m``. With its mask fixed dropout is linear: forward mode is ``x_dot * m``
(``+ add_dot`` with the residual path) and the backward's tangent ``dy_dot * m``.

Masks come from the model's single :class:`~numformer.backend.RandomState`, so a seed
reproduces a run and a gradient check can replay the same mask by restoring the
generator's state. Shapes: any -> same.
"""
from __future__ import annotations

import numpy as np

from ..kernels import kernel
from ..module import Module
from .registry import registered


def dropout_mask(rng, shape, p: float, dtype):
    """The mask ``m``: ``1/(1 - p')`` where kept, 0 where dropped.

    ``u_i`` is 16 random bits: an element is dropped when its bits are below ``t = round(p * 2^16)``,
    so ``p' = t / 2^16`` (0.1 -> 0.100006) and the scale uses ``p'``: the expectation is exact.
    ``m_i = [u_i >= t] * 2^16 / (2^16 - t)``, in ``dtype``. Where the bits come from (element ``i`` of
    the ``n`` in C order):

    * CPU (``rng.kind == "pcg64"``): those of one ``random_raw(ceil(n / 4))`` call, four 16-bit
      elements per 64-bit word, low half first.
    * GPU (``rng.kind == "philox"``; a CPU generator made with ``generator="philox"`` draws the same):
      ``u_i`` is the 16-bit half ``i mod 8`` (low half first) of the four 32-bit words
      ``Philox4x32-10(key = (seed mod 2^32, seed >> 32), counter = (c mod 2^32, c >> 32, 0, 0))``,
      ``c = offset + i // 8`` (mod 2^64), with ``[seed, offset]`` the generator's state on the device
      (``rng.counter``); the draw then moves ``offset`` by ``ceil(n / 8)`` on the device
      (:mod:`numformer.counter_rng`). The fused kernel (numformer/kernels/dropout.py) makes these bits.
    """
    if rng.kind == "pcg64":
        n = int(np.prod(shape, dtype=np.int64))
        threshold = int(round(p * 65536))
        bits = rng.generator.bit_generator.random_raw(-(-n // 4)).view(np.uint16)[:n]
        keep = bits >= threshold
        return (keep * np.asarray(65536.0 / (65536 - threshold), dtype=dtype)).reshape(shape)
    threshold = int(round(p * 65536))
    keep = rng.stream16(shape) >= threshold
    scale = np.dtype(dtype).type(65536.0 / (65536 - threshold))  # a scalar of the dtype: no copy to the device
    return keep.astype(dtype) * scale


def dropout_forward(x, rng, p: float, add=None):
    """-> (y, m): y = x * m (+ add), with m = dropout_mask(...).

    ``add`` (x's shape) is the residual connection of Section 3.1 when dropout is the last
    step of a sub-layer: ``x + Dropout(Sublayer(x))``.
    """
    mask = dropout_mask(rng, x.shape, p, x.dtype)
    y = x * mask
    if add is not None:
        y = y + add
    return y, mask


def dropout_backward(dy, mask):
    """dx = dy * m."""
    return dy * mask


@registered
class Dropout(Module):
    """Zero elements with probability ``p`` in training mode; identity in eval mode or when p = 0.
    Saved for backward: ``mask``, the kept elements scaled by 1 / (1 - p) (None when inactive)."""

    kinks = False  # a fixed mask: linear (Module.kinks: the layer contract)

    def __init__(self, p: float, rng=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)
        self.rng = rng

    def _moved(self, xp) -> None:
        """Module.to(): a generator of this layer's own moves with it (a shared one is moved by its owner too)."""
        if self.rng is not None:
            self.rng.to(xp)

    def active(self) -> bool:
        return self.training and self.p > 0.0

    def forward(self, x, add=None):
        """x (any shape) -> dropout(x) (+ ``add``, an array of x's shape: the residual path)."""
        if not self.active():
            self.save_for_backward(mask=None)
            return x if add is None else x + add
        if self.rng is None:
            raise ValueError("Dropout with p > 0 needs a RandomState (rng=...)")
        y, mask = kernel(dropout_forward)(x, self.rng, self.p, add)
        self.save_for_backward(mask=mask)
        return y

    def backward(self, dy):
        mask = self.pop_saved("mask")
        return dy if mask is None else dropout_backward(dy, mask)

    def jvp(self, x_dot, add_dot=None):
        """x_dot (x's shape) -> x_dot * m (+ ``add_dot``, the residual path's tangent), the forward's mask."""
        mask = self.peek_saved("mask")
        y_dot = x_dot if mask is None else x_dot * mask
        return y_dot if add_dot is None else y_dot + add_dot

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot) = (dy * m, dy_dot * m)."""
        mask = self.peek_saved("mask")
        dx_dot = dy_dot if mask is None else dropout_backward(dy_dot, mask)
        return self.backward(dy), dx_dot
