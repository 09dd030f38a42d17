"""Fast dropout on the host: the mask's bits drawn by the host threads, applied while in cache.

Same inputs and outputs as :func:`numformer.layers.dropout.dropout_forward` and
``dropout_backward``, and the very same mask: the plain math draws one
``random_raw(ceil(n / 4))`` call; here each thread draws its share from a copy of the
PCG64 generator advanced to that share (``PCG64.advance``), so the bits are the same
for any thread count and the model's generator ends where the one call would leave it.
Each block of ``DROPOUT_BLOCK`` elements is made into mask values and applied (with the
residual ``add``) by the thread that drew it, while it is in cache.
Measured (2,560 x 256, 2 threads): 0.54 ms to make the mask against 0.75 ms for one
``integers(0, 65536, dtype=uint16)`` call, before the fused apply.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from ..layers.dropout import dropout_backward, dropout_forward
from . import replaces
from .threads import parallel_ranges, parallel_rows

DROPOUT_BLOCK = 1 << 15  # elements per block: drawn, made and applied in cache


@replaces(dropout_forward)
def dropout_forward_fast(x, rng, p: float, add=None):
    if (is_cupy_array(x) or not x.flags.c_contiguous
            or (add is not None and (add.shape != x.shape or not add.flags.c_contiguous))):
        return dropout_forward(x, rng, p, add)
    n = x.size
    threshold = int(round(p * 65536))
    scale = np.asarray(65536.0 / (65536 - threshold), dtype=x.dtype)
    mask = np.empty(n, dtype=x.dtype)
    out = np.empty(n, dtype=x.dtype)
    xf = x.reshape(-1)
    af = None if add is None else add.reshape(-1)
    bit_gen = rng.generator.bit_generator
    start = bit_gen.state
    words = -(-n // 4)
    bit_gen.advance(words)           # where one random_raw(words) call leaves the generator
    block_words = DROPOUT_BLOCK // 4

    def fill(w0, w1):
        gen = type(bit_gen)(0)
        gen.state = start
        gen.advance(w0)
        for b0 in range(w0, w1, block_words):  # cache-sized blocks, in order
            b1 = min(b0 + block_words, w1)
            lo, hi = 4 * b0, min(4 * b1, n)
            mb = mask[lo:hi]
            # bool x scale -> float in one pass (no astype copy then a second scaling pass)
            np.multiply(gen.random_raw(b1 - b0).view(np.uint16)[: hi - lo] >= threshold, scale, out=mb)
            np.multiply(xf[lo:hi], mb, out=out[lo:hi])
            if af is not None:
                out[lo:hi] += af[lo:hi]

    parallel_ranges(fill, words, n)
    return out.reshape(x.shape), mask.reshape(x.shape)


def _rows(a):
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(-1, 1)


@replaces(dropout_backward)
def dropout_backward_fast(dy, mask):
    if is_cupy_array(dy) or not (dy.flags.c_contiguous and mask.flags.c_contiguous):
        return dropout_backward(dy, mask)
    dx = np.empty_like(dy)
    parallel_rows(lambda a, m, o: np.multiply(a, m, out=o), _rows(dy), _rows(mask), _rows(dx),
                  chunk_elements=DROPOUT_BLOCK)
    return dx
