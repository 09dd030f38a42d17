"""Exercise: the learned positional embedding's backward, a sum over the batch into the rows used (Section 3.5,
Table 3 row E)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
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
    two = cls(D, 16, dtype=np.float64, rng=rng)  # (made after the others: their draws as before)
    return [GradCase("LearnedPositionalEmbedding", "offset 3, x (3, 6, 8)", one, {"x": x},
                     lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("LearnedPositionalEmbedding", "one table, two uses: source (3, 6, 8) from row 0, target "
                     "(3, 5, 8) from row 1", shared, {"x": x, "y": y},
                     lambda m, i: (m.src(i["x"]), m.tgt(i["y"], offset=1)),
                     lambda m, g: {"y": m.tgt.backward(g[1]), "x": m.src.backward(g[0])}),
            GradCase("LearnedPositionalEmbedding", "the table's last rows: offset 6, x (2, 4, 8), max_len 10", end,
                     {"x": rng.standard_normal((2, 4, D))},
                     lambda m, i: m(i["x"], offset=6), lambda m, g: {"x": m.backward(g[0])}),
            # the notes' "any number of leading axes": a sum over the first axis alone is (3, 4, 8) here, not (4, 8)
            GradCase("LearnedPositionalEmbedding", "two leading axes: x (2, 3, 4, 8) from row 0", two,
                     {"x": rng.standard_normal((2, 3, 4, D))},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


EXERCISE = Exercise(
    stage="table",
    name="learned_positions", title="the learned positional embedding's backward", paper="Section 3.5, Table 3 row E",
    symbols={"T": lambda a: a["dy"].shape[-2], "d": lambda a: a["dy"].shape[-1],
             "B": lambda a: a["dy"].reshape(-1, *a["dy"].shape[-2:]).shape[0]},
    target=learned_positions_backward, layer=LearnedPositionalEmbedding, cases=cases, outputs=("grad", "dx"),
    swap="LearnedPositionalEmbedding", upstream=("dy",), in_place=("grad",),
    mistakes=(assigned_not_added, batch_not_summed, batch_averaged, offset_ignored, input_gradient_zero,
              input_gradient_none),
    notes="grad is the table's .grad (max_len, d_model): add into it in place and return it, with dx. dy is "
          "(batch, T, d_model) (any number of leading axes); offset is the first row forward used. Padding "
          "positions are ordinary positions here (their P row was added too).",
    forward="""
        The forward (Section 3.5, Table 3 row E): the sinusoids of Section 3.5 are replaced by a trained table P
        (max_len, d_model), one row per position, and row t + offset is added to position t of every sentence
        of the batch:

            y[b, t] = x[b, t] + P[t + offset]        for every batch index b and t = 0 .. T-1
            x, y (batch, T, d_model); P (max_len, d_model); offset >= 0 (past 0 in incremental decoding)

        In array terms y = x + P[offset : offset + T]: a slice of T rows of P, broadcast over the batch axes
        (dy may have any number of leading axes in front of (T, d_model)). Padding positions are ordinary
        positions here: their row of P was added too.

        Your function receives grad, the table's gradient P.grad (max_len, d_model), which may already hold
        gradients from other uses of the same table (the source and target stacks may share it, and
        gradients are accumulated between steps); dy = dL/dy (batch, T, d_model); and offset, the first row
        the forward used. It adds dL/dP into grad, in place (accumulated, never assigned), and returns
        (grad, dx): the same grad array, and dx = dL/dx (batch, T, d_model), x's gradient (x is a float input
        here, not ids, so it has one).""",
    returns="Return (grad, dx): grad (max_len, d_model), P's gradient with dL/dP added in place, and dx = dL/dx "
            "(batch, T, d_model), from dy (batch, T, d_model) and the forward's first row offset.",
    steps=("x first: in y[b, t] = x[b, t] + P[t + offset] the input enters the sum with coefficient 1, so its "
           "gradient is the upstream gradient itself, with x's shape (not zeros, not None: x is a float input "
           "with a gradient). Returning dy itself is fine as long as nothing changes it in place.",
           "Which rows of P get a gradient: position t of the sentence read row t + offset, so that row's "
           "gradient comes from dy[..., t, :]. The rows before offset and after offset + T - 1 were not used: "
           "they get nothing (and rows 0 .. T-1 are the wrong rows whenever offset > 0).",
           "The batch: the same row P[t + offset] was added to every sentence b (a broadcast over the batch "
           "axes), so by the chain rule its gradient is the sum over b of dy[b, t]: a sum over every leading "
           "axis, not an average (each sentence contributes its whole gradient), and not dy (batch, T, d_model) "
           "added to T rows as it is.",
           "Accumulate: grad may already hold the gradient of another use of the table (a table shared by "
           "source and target, or an earlier step), so add into it (+=), in place, never assign.",
           "The whole backward: dP[t + offset] += sum_b dy[b, t] for t = 0 .. T-1, dx = dy. In NumPy: take "
           "T, d = dy.shape[-2:] (time and d_model, the last two axes), flatten the leading axes with "
           "dy.reshape(-1, T, d) and .sum(axis=0) it to (T, d), add that into the slice grad[offset : offset + T] "
           "with +=, and return (grad, dy). No loop over batch or time."))
