"""Fast Linear forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.linear.linear_forward` / ``linear_backward``.

The bias is added in place on the GEMM's fresh output, in row blocks over the host
threads (no second (n, d_out) array); the bias gradient, a column sum, is a GEMV with a
ones vector (BLAS, threaded): 0.18 ms against 0.44 ms for ``.sum(axis=0)`` on (2560, 1024).
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from ..layers.linear import linear_backward, linear_forward
from ..precision import matmul
from . import replaces
from .threads import parallel_rows


@replaces(linear_forward)
def linear_forward_fast(x, w, b):
    if is_cupy_array(x):
        return linear_forward(x, w, b)
    y = matmul(x, w)
    if b is not None:
        parallel_rows(lambda yb: np.add(yb, b, out=yb), y, chunk_elements=1 << 16)
    return y


@replaces(linear_backward)
def linear_backward_fast(dy, x, w, with_bias: bool):
    if is_cupy_array(dy):
        return linear_backward(dy, x, w, with_bias)
    db = np.ones(dy.shape[0], dtype=dy.dtype) @ dy if with_bias else None
    return matmul(dy, w.T), matmul(x.T, dy), db
