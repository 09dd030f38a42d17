"""Exercise 6 of 18: the backward of the softmax (Eq. 1). Level: derive.

The softmax that turns attention scores into weights (Eq. 1: Attention(Q, K, V) = softmax(Q K^T /
sqrt(d_k)) V), taken over the last axis: each row x of n entries (one per key) becomes

    y_i = exp(x_i) / S,        S = sum_k exp(x_k),        i, k = 1 .. n

(numformer's softmax subtracts the row maximum before exp: that changes nothing mathematically and
keeps exp from overflowing.) Each row is normalised on its own: the y of a row sum to 1, and all of
them share that row's denominator S, so every y_i of a row depends on every x_k of the same row, and
on nothing in other rows.

Your function receives dy = dL/dy and the forward's output y = softmax(x), both of shape (..., n)
with any number of leading axes (in attention (batch, heads, queries, keys)); it does not get x. It
returns dx = dL/dx, of the same shape. Do not build the (n, n) Jacobian of each row: one line of
NumPy does it.

Your part: derive the backward pass on paper from the forward above, then write the body of
softmax_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_softmax.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_softmax.py
"""

import numpy as np

from grad_checks.layer_cases import SoftmaxFunction as NumformerSoftmaxFunction
from numformer.swap import using

EXERCISE = "softmax"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.softmax.softmax:
# def softmax(x):
#     """y = exp(x - max x) / sum exp(x - max x), over the last axis."""
#     xp = get_array_module(x)
#     e = xp.exp(x - x.max(axis=-1, keepdims=True))
#     return e / e.sum(axis=-1, keepdims=True)
#
# grad_checks.layer_cases.SoftmaxFunction.forward:
# def forward(self, x):
#     y = softmax_fn(x)
#     self.save_for_backward(y=y)
#     return y
#
# grad_checks.layer_cases.SoftmaxFunction.backward:
# def backward(self, dy):
#     return softmax_backward(dy, self.pop_saved("y"))


def softmax_backward(dy, y):
    """Return dx = dL/dx (..., n), from dy (..., n) and the forward's output y = softmax(x) over the
    last axis (..., n)."""
    n = y.shape[-1]
    eye = np.eye(n, dtype=y.dtype)
    # J[..., i, k] = dy_i / dx_k = y_i (delta_ik - y_k)
    jac = y[..., :, None] * (eye - y[..., None, :])
    # dx_k = sum_i dy_i J_ik
    return np.einsum("...i,...ik->...k", dy, jac)


# numformer's SoftmaxFunction, its methods calling your softmax_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
SoftmaxFunction = using(NumformerSoftmaxFunction, softmax_backward=softmax_backward)
