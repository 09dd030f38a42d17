"""Linear layer ``y = x W + b`` (the projections of Sections 3.2.2 and 3.3).

Backward: ``dW = x^T dy``, ``db = sum(dy)`` over rows, ``dx = dy W^T``.

Forward mode (the tangents ``x_dot``, ``W_dot``, ``b_dot``; numformer/forward_mode.py), the product rule:
``y_dot = x_dot W + x W_dot + b_dot``. The backward's tangent (Pearlmutter's R-operator, with ``dy_dot`` the
upstream gradient's): ``dx_dot = dy_dot W^T + dy W_dot^T``, ``dW_dot = x_dot^T dy + x^T dy_dot``,
``db_dot = sum(dy_dot)`` over rows. (A zero parameter tangent's term is left out, and a gradient tangent nobody
reads is not computed: a block's Hessian-vector products need the block's alone.)
Shapes: x (..., d_in) -> y (..., d_out); the leading axes are flattened into rows, so
each product is one GEMM. The weight is stored as (d_in, d_out), so the forward pass
needs no transpose. (PyTorch stores (d_out, d_in): the parity tests transpose.)
``matmul`` is ``@`` unless a lower-precision mode is set (:func:`numformer.backend.matmul`).
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE, matmul
from ..kernels import kernel
from ..module import Module, Parameter
from .init import DEFAULT_SCHEME, linear_bound
from .registry import registered


def linear_forward(x, w, b):
    """x (n, d_in) -> y = x W + b (n, d_out); b may be None."""
    y = matmul(x, w)
    return y if b is None else y + b


def linear_backward(dy, x, w, with_bias: bool):
    """dy (n, d_out) -> (dx = dy W^T, dW = x^T dy, db = sum over rows of dy, or None)."""
    db = dy.sum(axis=0) if with_bias else None
    return matmul(dy, w.T), matmul(x.T, dy), db


def linear_jvp(x, w, x_dot, w_dot, b_dot):
    """x, x_dot (n, d_in); w (d_in, d_out) -> y_dot = x_dot W + x W_dot + b_dot (n, d_out); W_dot (d_in, d_out) and
    b_dot (d_out,) None where zero: their terms left out."""
    y_dot = matmul(x_dot, w)
    if w_dot is not None:
        y_dot = y_dot + matmul(x, w_dot)
    return y_dot if b_dot is None else y_dot + b_dot


def linear_backward_jvp(dy, x, w, dy_dot, x_dot, w_dot, weight: bool, bias: bool):
    """The tangent of linear_backward -> (dx_dot = dy_dot W^T + dy W_dot^T, dW_dot = x_dot^T dy + x^T dy_dot,
    db_dot = sum over rows of dy_dot); W_dot None where zero; dW_dot (db_dot) None unless ``weight`` (``bias``)
    asks for it."""
    dx_dot = matmul(dy_dot, w.T)
    if w_dot is not None:
        dx_dot = dx_dot + matmul(dy, w_dot.T)
    dw_dot = matmul(x_dot.T, dy) + matmul(x.T, dy_dot) if weight else None
    return dx_dot, dw_dot, dy_dot.sum(axis=0) if bias else None


@registered
class Linear(Module):
    """Affine map on the last axis; uniform weights (``init.py``'s scheme and role), zero bias.
    Saved for backward: ``x`` (n, d_in), the input's rows; by jvp: ``x`` (n, d_in), their tangent."""

    kinks = False  # affine (Module.kinks: the layer contract)

    def __init__(self, d_in: int, d_out: int, bias: bool = True, rng=None, dtype=DEFAULT_DTYPE,
                 init: str = DEFAULT_SCHEME, role: str = "ffn"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        bound = linear_bound(d_in, d_out, init, role)
        self.d_in, self.d_out = d_in, d_out
        self.weight = Parameter(rng.uniform(-bound, bound, (d_in, d_out)).astype(dtype))
        self.bias = Parameter(np.zeros(d_out, dtype=dtype)) if bias else None

    def forward(self, x):
        """x (..., d_in) -> (..., d_out)."""
        x2 = x.reshape(-1, self.d_in)
        y = kernel(linear_forward)(x2, self.weight.data, None if self.bias is None else self.bias.data)
        self.save_for_backward(x=x2)
        return y.reshape(*x.shape[:-1], self.d_out)

    def backward(self, dy):
        """dy (..., d_out) -> dx (..., d_in); adds dW and db into the gradients."""
        dx, dw, db = kernel(linear_backward)(dy.reshape(-1, self.d_out), self.pop_saved("x"), self.weight.data,
                                             self.bias is not None)
        self.weight.grad += dw
        if self.bias is not None:
            self.bias.grad += db
        return dx.reshape(*dy.shape[:-1], self.d_in)

    def jvp(self, x_dot):
        """x_dot (..., d_in) -> y_dot (..., d_out), with the weight's and bias's tangents."""
        x, x_dot2 = self.peek_saved("x"), x_dot.reshape(-1, self.d_in)
        self.save_tangents(x=x_dot2)
        y_dot = linear_jvp(x, self.weight.data, x_dot2, self.weight.nonzero_tangent,
                           None if self.bias is None else self.bias.nonzero_tangent)
        return y_dot.reshape(*x_dot.shape[:-1], self.d_out)

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot); adds dW, db into the gradients and dW_dot, db_dot into their tangents."""
        x, x_dot = self.peek_saved("x"), self.pop_tangents("x")
        with_bias = self.bias is not None and self.bias.wants_grad_tangent
        dx_dot, dw_dot, db_dot = linear_backward_jvp(dy.reshape(-1, self.d_out), x, self.weight.data,
                                                     dy_dot.reshape(-1, self.d_out), x_dot,
                                                     self.weight.nonzero_tangent, self.weight.wants_grad_tangent,
                                                     with_bias)
        if dw_dot is not None:
            self.weight.grad_tangent += dw_dot
        if db_dot is not None:
            self.bias.grad_tangent += db_dot
        return self.backward(dy), dx_dot.reshape(*dy.shape[:-1], self.d_in)
