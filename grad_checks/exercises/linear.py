"""Exercise: the backward of a linear map y = x W + b (every projection of the model)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
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
    name="linear", title="the backward of a linear map", paper="Section 3.3", target=linear_backward, layer=Linear,
    cases=cases, outputs=("dx", "dW", "db"), swap="Linear",
    mistakes=(weight_gradient_transposed, input_gradient_without_transpose, bias_gradient_mean,
              bias_gradient_wrong_axis),
    show=(linear_forward,),
    notes="The layer flattens the leading axes into rows first: x is (n, d_in), dy (n, d_out), W (d_in, d_out). "
          "Return db = None when with_bias is False. numformer's matmul is @ (it only changes in the opt-in "
          "lower-precision modes): write @.")
