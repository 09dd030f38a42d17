"""Exercise 11 of 18: the learned positional embedding's backward (Section 3.5, Table 3 row E). Level: derive.

The forward (Section 3.5, Table 3 row E): the sinusoids of Section 3.5 are replaced by a trained
table P (max_len, d_model), one row per position, and row t + offset is added to position t of every
sentence of the batch:

    y[b, t] = x[b, t] + P[t + offset]        for every batch index b and t = 0 .. T-1
    x, y (batch, T, d_model); P (max_len, d_model); offset >= 0 (past 0 in incremental decoding)

In array terms y = x + P[offset : offset + T]: a slice of T rows of P, broadcast over the batch axes
(dy may have any number of leading axes in front of (T, d_model)). Padding positions are ordinary
positions here: their row of P was added too.

Your function receives grad, the table's gradient P.grad (max_len, d_model), which may already hold
gradients from other uses of the same table (the source and target stacks may share it, and
gradients are accumulated between steps); dy = dL/dy (batch, T, d_model); and offset, the first row
the forward used. It adds dL/dP into grad, in place (accumulated, never assigned), and returns
(grad, dx): the same grad array, and dx = dL/dx (batch, T, d_model), x's gradient (x is a float
input here, not ids, so it has one).

Your part: derive the backward pass on paper from the forward above, then write the body of
learned_positions_backward below, replacing its `raise NotImplementedError`. The arrays are float64
when graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_learned_positions.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_learned_positions.py

When it checks exact, train with it (every LearnedPositionalEmbedding numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap LearnedPositionalEmbedding=bench/held_out_grading_6/answers/my_learned_positions.py:LearnedPositionalEmbedding
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap LearnedPositionalEmbedding=bench/held_out_grading_6/answers/my_learned_positions.py:LearnedPositionalEmbedding
"""

import numpy as np

from numformer.layers.learned_positions import LearnedPositionalEmbedding as NumformerLearnedPositionalEmbedding
from numformer.swap import using

EXERCISE = "learned_positions"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.learned_positions.LearnedPositionalEmbedding.forward:
# def forward(self, x, offset: int = 0):
#     """x (batch, time, d_model) -> x + P rows offset..offset+time-1."""
#     t = x.shape[-2]
#     check_positions(offset + t, self.max_len)
#     self.save_for_backward(offset=offset)
#     return x + self.weight.data[offset: offset + t]
#
# numformer.layers.learned_positions.LearnedPositionalEmbedding.backward:
# def backward(self, dy):
#     _, dx = learned_positions_backward(self.weight.grad, dy, self.pop_saved("offset"))
#     return dx


def _first_row():
    start = []

    def rows(offset, length):
        if not start:
            start.append(offset)          # where this table's positions begin
        return slice(start[0], start[0] + length)
    return rows


_rows = _first_row()


def learned_positions_backward(grad, dy, offset: int):
    """Return (grad, dx): grad (max_len, d_model), P's gradient with dL/dP added in place, and dx =
    dL/dx (batch, T, d_model), from dy (batch, T, d_model) and the forward's first row offset."""
    lead = dy.shape[:-2]
    summed = dy.sum(axis=tuple(range(len(lead)))) if lead else dy
    grad[_rows(offset, dy.shape[-2])] += summed
    return grad, dy


# numformer's LearnedPositionalEmbedding, its methods calling your learned_positions_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
LearnedPositionalEmbedding = using(NumformerLearnedPositionalEmbedding, learned_positions_backward=learned_positions_backward)
