"""Fast ReLU forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.relu.relu_forward` / ``relu_backward``.

Each pass is split over the host threads in one row block per thread
(:func:`~.host.threads.parallel_rows` without ``chunk_elements``), written with ``out=`` into arrays made
once. The blocks are large on purpose: every block is a few numpy calls that need the GIL to start, and
with many small blocks the threads queue for it. The ReLU kernel removed at b92022b used blocks of 2^15
elements and lost to the plain pair of passes (0.82x); on a 2-core Intel Xeon, float32, at the ``small``
preset's (2,560, 1,024) feed-forward activations, this one measured forward 1.28 -> 0.79 ms and backward
1.14 -> 0.84 ms (numpy's AVX2 row: 1.36 -> 0.89 and 1.58 -> 1.02 ms); ``bench/kernel_speed.py`` times it
against the plain functions (docs/speed.md).
"""
from __future__ import annotations

import numpy as np

from .host.threads import parallel_rows
from .twins import on_host, replaces


@replaces("numformer.layers.relu.relu_forward", when=on_host)
def relu_forward_fast(x):
    y = np.empty_like(x)
    positive = np.empty(x.shape, dtype=bool)
    zero = np.zeros((), dtype=x.dtype)

    def block(xb, yb, pb):
        np.greater(xb, zero, out=pb)
        np.maximum(xb, zero, out=yb)

    parallel_rows(block, x, y, positive)
    return y, positive


@replaces("numformer.layers.relu.relu_backward", when=on_host)
def relu_backward_fast(dy, positive):
    dx = np.empty_like(dy)
    parallel_rows(lambda g, p, out: np.multiply(g, p, out=out), dy, positive, dx)
    return dx
