"""Exercise 5 of 18: the backward of a linear map (Section 3.3). Level: derive.

The linear map behind every projection of the model (the W^Q, W^K, W^V and W^O of Section 3.2.2, the
two layers of the feed-forward network of Section 3.3, Eq. 2). The layer flattens the leading axes
(batch, time) into n rows first, so one matrix product does all of them:

    y = x W + b                         x (n, d_in), W (d_in, d_out), b (d_out,), y (n, d_out)
    y_ij = sum_k x_ik W_kj + b_j        i = 1 .. n, j = 1 .. d_out, k = 1 .. d_in

The weight is stored (d_in, d_out), so the forward needs no transpose (PyTorch stores the transpose,
(d_out, d_in)). b is added to every row. W and b are shared by all n rows (every batch and time
position).

Your function receives dy = dL/dy (n, d_out), the forward's input x (n, d_in), the weight w (d_in,
d_out) and with_bias (bool: whether the layer has a bias). It returns a tuple (dx, dW, db): dL/dx
(n, d_in), dL/dW (d_in, d_out) and dL/db (d_out,); db is None when with_bias is False. Write matrix
products with @ (numformer's matmul is @; it differs only in the opt-in lower-precision modes).

Your part: derive the backward pass on paper from the forward above, then write the body of
linear_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when graded
and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_linear.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_linear.py

When it checks exact, train with it (every Linear numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap Linear=bench/held_out_grading_6/answers/my_linear.py:Linear
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap Linear=bench/held_out_grading_6/answers/my_linear.py:Linear
"""

import numpy as np

from numformer.layers.linear import Linear as NumformerLinear
from numformer.swap import using

EXERCISE = "linear"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.linear.linear_forward:
# def linear_forward(x, w, b):
#     """x (n, d_in) -> y = x W + b (n, d_out); b may be None."""
#     y = matmul(x, w)
#     return y if b is None else y + b
#
# numformer.layers.linear.Linear.forward:
# def forward(self, x):
#     """x (..., d_in) -> (..., d_out)."""
#     x2 = x.reshape(-1, self.d_in)
#     y = kernel(linear_forward)(x2, self.weight.data, None if self.bias is None else self.bias.data)
#     self.save_for_backward(x=x2)
#     return y.reshape(*x.shape[:-1], self.d_out)
#
# numformer.layers.linear.Linear.backward:
# def backward(self, dy):
#     dx, dw, db = kernel(linear_backward)(dy.reshape(-1, self.d_out), self.pop_saved("x"), self.weight.data,
#                                          self.bias is not None)
#     self.weight.grad += dw
#     if self.bias is not None:
#         self.bias.grad += db
#     return dx.reshape(*dy.shape[:-1], self.d_in)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def linear_backward(dy, x, w, with_bias: bool):
    """Return (dx, dW, db): dL/dx (n, d_in), dL/dW (d_in, d_out) and dL/db (d_out,) or None when
    with_bias is False, from dy (n, d_out), the forward's input x (n, d_in) and the weight w
    (d_in, d_out)."""
    dx = dy @ w.T
    dW = dy.T @ x
    db = dy.sum(axis=0) if with_bias else None
    return dx, dW, db


# numformer's Linear, its methods calling your linear_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
Linear = using(NumformerLinear, linear_backward=linear_backward)
