"""Exercise: the backward of the softmax over the last axis (the attention weights of Eq. 1)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
from numformer.layers.softmax import softmax, softmax_backward

from ..cases import SoftmaxFunction
from ..exercise import Exercise


def without_row_sum(dy, y):
    """dx = y * dy misses the row sum: each y_i depends on every x_j of its row, dx = y * (dy - sum(dy * y))."""
    return y * dy


def diagonal_of_the_jacobian(dy, y):
    """dx = dy * y * (1 - y) keeps only dy_i/dx_i: the off-diagonal terms -y_i y_j are missing."""
    return dy * y * (1.0 - y)


def row_sum_without_y(dy, y):
    """The row sum is of dy alone: the Jacobian weighs each dy_j by y_j, so it is sum(dy * y)."""
    return y * (dy - dy.sum(axis=-1, keepdims=True))


def row_sum_over_wrong_axis(dy, y):
    """The sum runs over an axis other than the last: the softmax normalises each row (last axis) on its own."""
    return y * (dy - (dy * y).sum(axis=-2, keepdims=True))


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    peaked = rng.standard_normal((2, 3, 7))
    peaked[..., 2] += 6.0  # one score dominates each row: y close to one-hot
    return [GradCase("Softmax", "scores (3, 4, 5, 6)", cls(), {"x": 2.0 * rng.standard_normal((3, 4, 5, 6))},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("Softmax", "peaked rows (2, 3, 7)", cls(), {"x": peaked},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("Softmax", "rows of one entry (4, 1)", cls(), {"x": rng.standard_normal((4, 1))},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


EXERCISE = Exercise(
    name="softmax", title="the backward of the softmax", paper="Eq. 1", target=softmax_backward,
    layer=SoftmaxFunction, cases=cases, outputs=("dx",), show=(softmax,),
    mistakes=(without_row_sum, diagonal_of_the_jacobian, row_sum_without_y, row_sum_over_wrong_axis),
    notes="y is softmax(x), kept by forward; dy, y and the result have the same shape (..., n). Do not build "
          "the (n, n) Jacobian: one line does it. numformer has no softmax layer to swap (attention calls the "
          "function); the attention exercise uses it.")
