"""Fast Linear forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.linear.linear_forward` / ``linear_backward``.

* forward: the bias is added in place on the GEMM's fresh output (``y += b``), where the plain
  ``y + b`` writes a second (n, d_out) array: one memory pass instead of a read, a write and a new
  allocation;
* backward: the bias gradient, a column sum, is a GEMV with a ones vector (BLAS, threaded)
  instead of numpy's one-thread ``.sum(axis=0)``.

Measured at the ``small`` training shape (2,560 rows) on a 2-core Intel Xeon (AVX-512), float32:
the bias add 0.99 -> 0.74 ms at d_out 1,024 and 0.51 -> 0.16 ms at 256; the column sum 0.54 -> 0.21 ms
and 0.14 -> 0.06 ms (the whole call against the plain one: ``bench/kernel_speed.py``; docs/speed.md).
A threaded bias add (row blocks in the host threads) measured slower than this one-thread in-place add,
so there is none.
"""
from __future__ import annotations

import numpy as np

from ..backend import matmul
from .twins import on_host, replaces


def _add_to_rows_(y, b) -> None:
    """``y[i] += b`` for every row i, in place."""
    np.add(y, b, out=y)


def _column_sums(a):
    """``a.sum(axis=0)`` as one GEMV: ``1^T a``."""
    return np.ones(a.shape[0], dtype=a.dtype) @ a


@replaces("numformer.layers.linear.linear_forward", when=on_host)
def linear_forward_fast(x, w, b):
    y = matmul(x, w)
    if b is not None:
        _add_to_rows_(y, b)  # y is the GEMM's own new array: writing it in place is safe
    return y


@replaces("numformer.layers.linear.linear_backward", when=on_host)
def linear_backward_fast(dy, x, w, with_bias: bool):
    db = _column_sums(dy) if with_bias else None
    return matmul(dy, w.T), matmul(x.T, dy), db
