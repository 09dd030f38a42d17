"""Linear layer ``y = x W + b`` (the projections of Sections 3.2.2 and 3.3).

Shapes: x (..., d_in) -> y (..., d_out). The weight is stored as (d_in, d_out)
so the forward pass is one GEMM on the flattened leading dimensions, with no
transpose. (PyTorch stores (d_out, d_in): the parity tests transpose.)
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module, parallel_rows
from ..module import Module, Parameter
from ..precision import matmul
from .init import linear_bound


def add_bias_(y, bias):
    """``y += bias`` on a (n, d) GEMM output, row blocks spread over the host threads."""
    xp = get_array_module(y)
    parallel_rows(lambda yb: xp.add(yb, bias, out=yb), y, chunk_elements=1 << 16)
    return y


class Linear(Module):
    """Affine map on the last axis; uniform weights (Xavier unless told, see ``init.py``), zero bias."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, rng=None, dtype=DEFAULT_DTYPE,
                 init: str = "xavier", role: str = "ffn"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        bound = linear_bound(d_in, d_out, init, role)
        self.d_in, self.d_out = d_in, d_out
        self.weight = Parameter(rng.uniform(-bound, bound, (d_in, d_out)).astype(dtype))
        self.bias = Parameter(np.zeros(d_out, dtype=dtype)) if bias else None
        self._cache_x = None

    def forward(self, x):
        """x (..., d_in) -> (..., d_out)."""
        lead = x.shape[:-1]
        y = matmul(x.reshape(-1, self.d_in), self.weight.data)  # plain @ unless a lower precision is set
        if self.bias is not None:
            add_bias_(y, self.bias.data)
        if self.training:
            self._cache_x = x
        return y.reshape(*lead, self.d_out)

    def backward(self, dy):
        """dy (..., d_out) -> dx (..., d_in); adds dL/dW = x^T dy and dL/db = sum(dy)."""
        x2 = self._cache_x.reshape(-1, self.d_in)
        dy2 = dy.reshape(-1, self.d_out)
        self.weight.grad += matmul(x2.T, dy2)
        if self.bias is not None:
            # column sum as a GEMV (BLAS, threaded): 0.18 ms against 0.44 ms for .sum(axis=0) on (2560, 1024)
            self.bias.grad += get_array_module(dy2).ones(dy2.shape[0], dtype=dy2.dtype) @ dy2
        self._cache_x = None
        return matmul(dy2, self.weight.data.T).reshape(*dy.shape[:-1], self.d_in)
