"""Exercise: the learned positional embedding's backward, a sum over the batch into the rows used (Section 3.5,
Table 3 row E)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
from numformer.layers.learned_positions import LearnedPositionalEmbedding, learned_positions_backward

from ..cases import D, Holder
from ..exercise import Exercise


def assigned_not_added(grad, dy, offset):
    """The rows are overwritten: a table used twice (shared, or gradients accumulated) must collect every use: add."""
    t, d = dy.shape[-2:]
    grad[offset: offset + t] = dy.reshape(-1, t, d).sum(axis=0)
    return grad, dy


def batch_not_summed(grad, dy, offset):
    """dy (batch, T, d_model) added to rows (T, d_model) as it is: every sentence used the same rows, sum over the batch."""
    t = dy.shape[-2]
    grad[offset: offset + t] += dy
    return grad, dy


def batch_averaged(grad, dy, offset):
    """The sentences' gradients are averaged: each sentence added P[t] to its own row, so each adds its whole dy."""
    t, d = dy.shape[-2:]
    grad[offset: offset + t] += dy.reshape(-1, t, d).mean(axis=0)
    return grad, dy


def offset_ignored(grad, dy, offset):
    """Rows 0..T-1 get the gradient: forward added rows offset..offset+T-1 (incremental decoding starts past 0)."""
    t, d = dy.shape[-2:]
    grad[:t] += dy.reshape(-1, t, d).sum(axis=0)
    return grad, dy


def input_gradient_zero(grad, dy, offset):
    """dx is zero: y = x + P[...] passes x straight through, so dx = dy (only the table is the layer's own)."""
    t, d = dy.shape[-2:]
    grad[offset: offset + t] += dy.reshape(-1, t, d).sum(axis=0)
    return grad, np.zeros_like(dy)


def input_gradient_none(grad, dy, offset):
    """dx is None: the token embedding returns None (ids have no gradient), but x here is a float input: dx = dy."""
    t, d = dy.shape[-2:]
    grad[offset: offset + t] += dy.reshape(-1, t, d).sum(axis=0)
    return grad, None


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    one = cls(D, 16, dtype=np.float64, rng=rng)
    src = cls(D, 16, dtype=np.float64, rng=rng)
    shared = Holder(src=src, tgt=cls(D, 16, dtype=np.float64, weight=src.weight))
    end = cls(D, 10, dtype=np.float64, rng=rng)
    x, y = rng.standard_normal((3, 6, D)), rng.standard_normal((3, 5, D))
    return [GradCase("LearnedPositionalEmbedding", "offset 3, x (3, 6, 8)", one, {"x": x},
                     lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("LearnedPositionalEmbedding", "one table, two uses: source (3, 6, 8) from row 0, target "
                     "(3, 5, 8) from row 1", shared, {"x": x, "y": y},
                     lambda m, i: (m.src(i["x"]), m.tgt(i["y"], offset=1)),
                     lambda m, g: {"y": m.tgt.backward(g[1]), "x": m.src.backward(g[0])}),
            GradCase("LearnedPositionalEmbedding", "the table's last rows: offset 6, x (2, 4, 8), max_len 10", end,
                     {"x": rng.standard_normal((2, 4, D))},
                     lambda m, i: m(i["x"], offset=6), lambda m, g: {"x": m.backward(g[0])})]


EXERCISE = Exercise(
    name="learned_positions", title="the learned positional embedding's backward", paper="Section 3.5, Table 3 row E",
    target=learned_positions_backward, layer=LearnedPositionalEmbedding, cases=cases, outputs=("grad", "dx"),
    swap="LearnedPositionalEmbedding", in_place=("grad",),
    mistakes=(assigned_not_added, batch_not_summed, batch_averaged, offset_ignored, input_gradient_zero,
              input_gradient_none),
    notes="grad is the table's .grad (max_len, d_model): add into it in place and return it, with dx. dy is "
          "(batch, T, d_model) (any number of leading axes); offset is the first row forward used. Padding "
          "positions are ordinary positions here (their P row was added too).")
