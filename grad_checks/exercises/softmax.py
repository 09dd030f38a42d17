"""Exercise: the backward of the softmax over the last axis (the attention weights of Eq. 1)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
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
    stage="row-wise",
    name="softmax", title="the backward of the softmax", paper="Eq. 1", target=softmax_backward,
    names={"dy * y": "dy * y, the row sum's summand", "(dy * y).sum(axis=-1, keepdims=True)": "s = rowsum(dy * y)",
           "dy - (dy * y).sum(axis=-1, keepdims=True)": "dy - s"},
    symbols={"n": lambda a: a["dy"].shape[-1]},
    layer=SoftmaxFunction, cases=cases, outputs=("dx",), show=(softmax,),
    mistakes=(without_row_sum, diagonal_of_the_jacobian, row_sum_without_y, row_sum_over_wrong_axis),
    notes="y is softmax(x), kept by forward; dy, y and the result have the same shape (..., n). Do not build "
          "the (n, n) Jacobian: one line does it. numformer has no softmax layer to swap (attention calls the "
          "function); the attention exercise uses it.",
    forward="""
        The softmax that turns attention scores into weights (Eq. 1: Attention(Q, K, V) = softmax(Q K^T /
        sqrt(d_k)) V), taken over the last axis: each row x of n entries (one per key) becomes

            y_i = exp(x_i) / S,        S = sum_k exp(x_k),        i, k = 1 .. n

        (numformer's softmax subtracts the row maximum before exp: that changes nothing mathematically and keeps
        exp from overflowing.) Each row is normalised on its own: the y of a row sum to 1, and all of them share
        that row's denominator S, so every y_i of a row depends on every x_k of the same row, and on nothing in
        other rows.

        Your function receives dy = dL/dy and the forward's output y = softmax(x), both of shape (..., n) with
        any number of leading axes (in attention (batch, heads, queries, keys)); it does not get x. It returns
        dx = dL/dx, of the same shape. Do not build the (n, n) Jacobian of each row: one line of NumPy does
        it.""",
    returns="Return dx = dL/dx (..., n), from dy (..., n) and the forward's output y = softmax(x) over the last "
            "axis (..., n).",
    steps=("Take one row. Every y_i depends on every x_j of the row (through the shared denominator S), so the "
           "chain rule sums over the row's outputs: dL/dx_j = sum_i dL/dy_i * dy_i/dx_j. You need the Jacobian "
           "entries dy_i/dx_j, and then a way to do that sum without building the (n, n) matrix.",
           "The Jacobian, most easily through log y_i = x_i - log S: d(log y_i)/dx_j = delta_ij - exp(x_j)/S = "
           "delta_ij - y_j, where delta_ij is 1 when i = j and 0 otherwise. Multiply by y_i: dy_i/dx_j = y_i "
           "(delta_ij - y_j). Its diagonal is y_i (1 - y_i), but the off-diagonal entries -y_i y_j are not zero: "
           "keeping only the diagonal forgets that each x_j also moves every other y_i.",
           "Put it into the sum: dL/dx_j = sum_i dy_i y_i (delta_ij - y_j) = y_j dy_j - y_j sum_i dy_i y_i. The "
           "delta keeps only i = j in the first term; the second term's sum is one number per row, and it weighs "
           "each dy_i by y_i (the sum of dy * y, not of dy alone). Everything is in terms of y: x is not needed.",
           "Whole backward: dx = y * (dy - s), with s = sum over the row (the last axis) of dy * y, one value per "
           "row. In NumPy: s = (dy * y).sum(axis=-1, keepdims=True), where keepdims=True keeps s as (..., 1) so "
           "that it broadcasts back along each row whatever the leading axes, then return y * (dy - s). The sum "
           "runs over the last axis, the one the softmax normalised, never another."))
