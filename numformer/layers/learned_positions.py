"""Learned positional embedding, Table 3 row (E) (Section 3.5).

Section 3.5: "We also experimented with using learned positional embeddings [9] instead, and found that
the two versions produced nearly identical results (see Table 3 row (E))." ([9] is Gehring et al. 2017,
convolutional sequence to sequence learning.) The sinusoid table of ``positional.py`` becomes a trained
Parameter P (max_len, d_model), one per stack, added the same way:

    y = x + P[offset : offset + T]          x, y (batch, T, d_model); offset > 0 in incremental decoding
    dL/dx = dL/dy                           x enters the sum with coefficient 1
    dL/dP[offset + t] += sum_b dL/dy[b, t]  every sentence of the batch used row offset + t; no other row is touched

Backward *adds* into ``P.grad`` (a table shared by two layers, or a step that accumulates gradients, must
collect every use) and sums over the batch axes, never a loop over batch or time.

Forward mode: ``y_dot = x_dot + P_dot[offset : offset + T]``. The backward is linear in dy and does not read P,
so its tangent is the same sum of ``dy_dot``: ``dL/dP_dot[offset + t] += sum_b dy_dot[b, t]``, ``dx_dot = dy_dot``.
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE
from ..module import Module, Parameter
from .positional import check_positions
from .registry import registered

# The scale of the initial table. Every row of the sinusoid table has squared norm d_model / 2 (each pair of
# columns holds sin^2 + cos^2 = 1), i.e. entries of mean square 1/2; rows drawn from N(0, 1/2) have that
# norm on average, so at step 0 the learned positions weigh against the token rows (unit variance:
# W[id] * sqrt(d_model) with W ~ N(0, d_model^-1/2)) as the paper's sinusoids do, and row (E) differs from
# base in being trained, not also in starting weaker. fairseq's N(0, d_model^-1/2) (unscaled) would start
# them at 1/sqrt(d_model) of the tokens' scale (0.04 at d_model 512).
INIT_STD = 2 ** -0.5


def learned_positions_backward(grad, dy, offset: int):
    """Backward of y = x + P[offset : offset + T]: rows offset..offset+T-1 of grad (max_len, d_model) get dy
    (..., T, d_model) summed over the leading (batch) axes, added in place; returns (grad, dx), dx = dy."""
    t, d = dy.shape[-2:]
    grad[offset: offset + t] += dy.reshape(-1, t, d).sum(axis=0)
    return grad, dy


@registered
class LearnedPositionalEmbedding(Module):
    """x + P[offset : offset + T] with P (max_len, d_model) a Parameter drawn from N(0, INIT_STD^2).

    Called like :class:`~numformer.layers.positional.PositionalEncoding` (``offset`` for incremental
    decoding). ``weight``: a table to share (tying, as the token embedding's ``weight``); ``rng``: the
    generator of the initial table (the model passes one derived from its seed).
    Saved for backward: ``offset``, the first row read.
    """

    kinks = False  # a lookup: linear in the weight (Module.kinks: the layer contract)

    def __init__(self, d_model: int, max_len: int = 1024, dtype=DEFAULT_DTYPE, rng=None,
                 weight: Parameter | None = None):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        if weight is None:
            rng = rng if rng is not None else np.random.default_rng(0)
            weight = Parameter(rng.normal(0.0, INIT_STD, (max_len, d_model)).astype(dtype))
        if weight.shape != (max_len, d_model):
            raise ValueError(f"shared positional table has shape {weight.shape}, expected {(max_len, d_model)}")
        self.weight = weight

    def forward(self, x, offset: int = 0):
        """x (batch, time, d_model) -> x + P rows offset..offset+time-1."""
        t = x.shape[-2]
        check_positions(offset + t, self.max_len)
        self.save_for_backward(offset=offset)
        return x + self.weight.data[offset: offset + t]

    def backward(self, dy):
        """dy (batch, time, d_model) -> dx = dy; adds dy summed over the batch into P's rows of the forward."""
        _, dx = learned_positions_backward(self.weight.grad, dy, self.pop_saved("offset"))
        return dx

    def jvp(self, x_dot):
        """x_dot (batch, time, d_model) -> x_dot + P_dot rows offset..offset+time-1."""
        offset, t, p_dot = self.peek_saved("offset"), x_dot.shape[-2], self.weight.nonzero_tangent
        return x_dot if p_dot is None else x_dot + p_dot[offset: offset + t]

    def backward_jvp(self, dy, dy_dot):
        """-> (dy, dy_dot); adds dy and dy_dot, summed over the batch, into P's gradient and its tangent."""
        if self.weight.wants_grad_tangent:
            learned_positions_backward(self.weight.grad_tangent, dy_dot, self.peek_saved("offset"))
        return self.backward(dy), dy_dot
