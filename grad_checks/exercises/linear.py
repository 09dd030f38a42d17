"""Exercise: the backward of a linear map y = x W + b (every projection of the model)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
from numformer.layers.linear import Linear, linear_backward, linear_forward

from ..exercise import Exercise


def weight_gradient_transposed(dy, x, w, with_bias):
    """dW = dy^T x is (d_out, d_in): the weight is stored (d_in, d_out) (y = x W), so dW = x^T dy."""
    return dy @ w.T, dy.T @ x, dy.sum(axis=0) if with_bias else None


def input_gradient_without_transpose(dy, x, w, with_bias):
    """dx = dy W multiplies by W itself: going back through y = x W multiplies by its transpose, dx = dy W^T."""
    return dy @ w, x.T @ dy, dy.sum(axis=0) if with_bias else None


def bias_gradient_mean(dy, x, w, with_bias):
    """db averages dy over the rows: every row (each batch x time position) adds its own dy: db = sum of dy."""
    return dy @ w.T, x.T @ dy, dy.mean(axis=0) if with_bias else None


def bias_gradient_wrong_axis(dy, x, w, with_bias):
    """db sums over the features (axis 1): b has one entry per output feature, so sum over the rows (axis 0)."""
    return dy @ w.T, x.T @ dy, dy.sum(axis=1) if with_bias else None


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, d_in, d_out, bias, shape in [("x (3, 4, 7), 7 -> 5", 7, 5, True, (3, 4, 7)),
                                           ("square 6 -> 6, x (10, 6)", 6, 6, True, (10, 6)),
                                           ("no bias, x (2, 3, 4), 4 -> 6", 4, 6, False, (2, 3, 4))]:
        m = cls(d_in, d_out, bias=bias, rng=rng, dtype=np.float64)
        if bias:
            m.bias.data[:] = rng.standard_normal(d_out)
        out.append(GradCase("Linear", name, m, {"x": rng.standard_normal(shape)},
                            lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}))
    return out


EXERCISE = Exercise(
    stage="matrix",
    name="linear", title="the backward of a linear map", paper="Section 3.3", target=linear_backward, layer=Linear,
    symbols={"n": lambda a: a["dy"].shape[0], "d_in": lambda a: a["x"].shape[1], "d_out": lambda a: a["dy"].shape[1]},
    cases=cases, outputs=("dx", "dW", "db"), swap="Linear",
    mistakes=(weight_gradient_transposed, input_gradient_without_transpose, bias_gradient_mean,
              bias_gradient_wrong_axis),
    show=(linear_forward,),
    notes="The layer flattens the leading axes into rows first: x is (n, d_in), dy (n, d_out), W (d_in, d_out). "
          "Return db = None when with_bias is False. numformer's matmul is @ (it only changes in the opt-in "
          "lower-precision modes): write @.",
    forward="""
        The linear map behind every projection of the model (the W^Q, W^K, W^V and W^O of Section 3.2.2, the
        two layers of the feed-forward network of Section 3.3, Eq. 2). The layer flattens the leading axes
        (batch, time) into n rows first, so one matrix product does all of them:

            y = x W + b                         x (n, d_in), W (d_in, d_out), b (d_out,), y (n, d_out)
            y_ij = sum_k x_ik W_kj + b_j        i = 1 .. n, j = 1 .. d_out, k = 1 .. d_in

        The weight is stored (d_in, d_out), so the forward needs no transpose (PyTorch stores the transpose,
        (d_out, d_in)). b is added to every row. W and b are shared by all n rows (every batch and time
        position).

        Your function receives dy = dL/dy (n, d_out), the forward's input x (n, d_in), the weight w (d_in,
        d_out) and with_bias (bool: whether the layer has a bias). It returns a tuple (dx, dW, db): dL/dx (n,
        d_in), dL/dW (d_in, d_out) and dL/db (d_out,); db is None when with_bias is False. Write matrix
        products with @ (numformer's matmul is @; it differs only in the opt-in lower-precision modes).""",
    returns="Return (dx, dW, db): dL/dx (n, d_in), dL/dW (d_in, d_out) and dL/db (d_out,) or None when with_bias "
            "is False, from dy (n, d_out), the forward's input x (n, d_in) and the weight w (d_in, d_out).",
    steps=("The bias first. y_ij = sum_k x_ik W_kj + b_j: b_j appears in column j of every row i, with derivative "
           "1, and it is shared by the n rows, so their contributions add up: dL/db_j = sum over the rows i of "
           "dy_ij. A sum, not a mean (each row adds its own term to the loss), and over the rows, not the "
           "features: db has one entry per output feature, (d_out,). None when with_bias is False.",
           "The input. x_ik appears in y_ij for every output feature j of its own row i (and in no other row), "
           "with dy_ij/dx_ik = W_kj. So dL/dx_ik = sum_j dy_ij W_kj: the sum runs over W's second index, so in "
           "matrix form it is dy times the transpose of W, (n, d_out) x (d_out, d_in) = (n, d_in). Multiplying by "
           "W itself would not even have the right shape unless W is square.",
           "The weight. W_kj is shared by every row: it appears in y_ij for every i, with dy_ij/dW_kj = x_ik. So "
           "dL/dW_kj = sum_i x_ik dy_ij, a sum over the rows, which is the transpose of x times dy: (d_in, n) x "
           "(n, d_out) = (d_in, d_out), the shape W is stored in. (dy^T x is the transpose of that, (d_out, "
           "d_in): PyTorch's layout, not numformer's.)",
           "Whole backward: dx = dy W^T, dW = x^T dy, db = sum over the rows of dy (None without a bias). In NumPy: "
           "dx = dy @ w.T, dW = x.T @ dy, db = dy.sum(axis=0) if with_bias else None, and return (dx, dW, db). "
           "Check each shape against its variable: dx like x, dW like w, db like b."))
