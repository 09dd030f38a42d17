"""Fast ReLU on the host: y and the active set in one pass per cache-sized block, in threads.

Same inputs and outputs as :func:`numformer.layers.relu.relu_forward` and ``relu_backward``.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from ..layers.relu import relu_backward, relu_forward
from . import replaces
from .threads import parallel_rows

RELU_BLOCK = 1 << 15  # elements per block


def _rows(a):
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(-1, 1)


@replaces(relu_forward)
def relu_forward_fast(x):
    if is_cupy_array(x) or not x.flags.c_contiguous:
        return relu_forward(x)
    y = np.empty_like(x)
    positive = np.empty(x.shape, dtype=bool)
    zero = np.asarray(0, dtype=x.dtype)

    def block(xb, yb, pb):
        np.greater(xb, zero, out=pb)
        np.maximum(xb, zero, out=yb)

    parallel_rows(block, _rows(x), _rows(y), _rows(positive), chunk_elements=RELU_BLOCK)
    return y, positive


@replaces(relu_backward)
def relu_backward_fast(dy, positive):
    if is_cupy_array(dy) or not (dy.flags.c_contiguous and positive.flags.c_contiguous):
        return relu_backward(dy, positive)
    dx = np.empty_like(dy)
    parallel_rows(lambda a, m, o: np.multiply(a, m, out=o), _rows(dy), _rows(positive), _rows(dx),
                  chunk_elements=RELU_BLOCK)
    return dx
