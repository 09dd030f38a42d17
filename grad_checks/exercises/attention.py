"""Exercise: the backward of scaled dot-product attention (Section 3.2.1, Eq. 1)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.gradcheck import GradCase
from numformer.layers.attention import ScaledDotProductAttention, attention_backward, attention_forward
from numformer.layers.softmax import softmax_backward

from ..cases import HEADS, S, T, _replay, padded_batch
from ..exercise import Exercise


def _ds(dout, v, p, masked, dropout_backward, row_sum=True, mask=True):
    """dS, the scores' gradient, unscaled; ``row_sum`` and ``mask`` switch off one step for the mistakes below."""
    dp = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    ds = softmax_backward(dp, p) if row_sum else p * dp
    return np.where(masked, 0.0, ds) if mask and masked is not None else ds


def scale_missing(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """The 1/sqrt(d_k) is missing from dQ and dK: the scores are Q K^T * scale, so their gradient carries the scale."""
    ds = _ds(dout, v, p, masked, dropout_backward)
    return ds @ k, ds.swapaxes(-1, -2) @ q, p_used.swapaxes(-1, -2) @ dout


def masked_scores_keep_gradient(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """Masked scores keep gradient: forward replaced them by a constant, so dS is 0 there (it shows in fully masked rows)."""
    ds = _ds(dout, v, p, masked, dropout_backward, mask=False) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, p_used.swapaxes(-1, -2) @ dout


def softmax_without_row_sum(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """The softmax backward lacks its row sum: dS = P * (dP - rowsum(dP * P)), not P * dP."""
    ds = _ds(dout, v, p, masked, dropout_backward, row_sum=False) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, p_used.swapaxes(-1, -2) @ dout


def dq_dk_swapped(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """dQ and dK swapped: S = Q K^T, so dQ = dS K and dK = dS^T Q (each with the scale)."""
    ds = _ds(dout, v, p, masked, dropout_backward) * scale
    return ds.swapaxes(-1, -2) @ q, ds @ k, p_used.swapaxes(-1, -2) @ dout


def transpose_missing_in_dv(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """dV = P dO misses a transpose: O = P V, so dV = P^T dO (keys by queries, times dO)."""
    ds = _ds(dout, v, p, masked, dropout_backward) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, p_used @ dout


def dropout_ignored(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    """Attention dropout ignored in backward: O = dropout(P) V, so dV = P_used^T dO and dP passes through the dropout's backward."""
    ds = _ds(dout, v, p, masked, None) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ dout


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    _, _, src_mask, tgt_mask = padded_batch(rng)
    b = src_mask.shape[0]
    out = []
    for name, tq, tk, mask in [("padding, Tq 5 != Tk 6, a fully masked row", T, S, src_mask),
                               ("causal + padding, Tq = Tk = 5", T, T, tgt_mask)]:
        ins = {"q": rng.standard_normal((b, HEADS, tq, 4)), "k": rng.standard_normal((b, HEADS, tk, 4)),
               "v": rng.standard_normal((b, HEADS, tk, 3))}
        out.append(GradCase("ScaledDotProductAttention", name, cls(), ins,
                            lambda m, i, mask=mask: m(i["q"], i["k"], i["v"], mask),
                            lambda m, g: dict(zip("qkv", m.backward(g[0])))))
    rs = RandomState(seed + 3)
    ins = {"q": rng.standard_normal((b, HEADS, T, 4)), "k": rng.standard_normal((b, HEADS, S, 4)),
           "v": rng.standard_normal((b, HEADS, S, 4))}
    out.append(GradCase("ScaledDotProductAttention", "attention dropout 0.2, one mask replayed", cls(0.2, rs), ins,
                        lambda m, i: m(i["q"], i["k"], i["v"], src_mask),
                        lambda m, g: dict(zip("qkv", m.backward(g[0]))), before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    name="attention", title="the backward of scaled dot-product attention", paper="Section 3.2.1, Eq. 1",
    target=attention_backward, layer=ScaledDotProductAttention, cases=cases, outputs=("dq", "dk", "dv"),
    show=(attention_forward,), swap="ScaledDotProductAttention",
    imports=("from numformer.layers.softmax import softmax_backward  # exercise 3's function, yours to use",),
    mistakes=(scale_missing, masked_scores_keep_gradient, softmax_without_row_sum, dq_dk_swapped,
              transpose_missing_in_dv, dropout_ignored),
    notes="Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v), p and p_used (B, h, Tq, Tk); masked "
          "is True where a score was replaced by -1e9 (broadcastable to p), or None; scale = 1/sqrt(d_k). "
          "dropout_backward is the attention dropout's backward (call it on a (B, h, Tq, Tk) gradient) or None "
          "when there is no attention dropout; p_used is dropout(P), or P itself. Batched matmuls (@) and "
          ".swapaxes(-1, -2) do every head at once: no loop.")
