"""Exercise: the backward of scaled dot-product attention (Section 3.2.1, Eq. 1)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
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
    # another d_k (so another scale) in the last case: a scale kept from the first call is wrong here, whichever
    # case runs first (grad_checks/kept_state.py runs each one first)
    rs = RandomState(seed + 3)
    ins = {"q": rng.standard_normal((b, HEADS, T, 8)), "k": rng.standard_normal((b, HEADS, S, 8)),
           "v": rng.standard_normal((b, HEADS, S, 4))}
    out.append(GradCase("ScaledDotProductAttention", "attention dropout 0.2, one mask replayed, d_k 8", cls(0.2, rs),
                        ins,
                        lambda m, i: m(i["q"], i["k"], i["v"], src_mask),
                        lambda m, g: dict(zip("qkv", m.backward(g[0]))), before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    stage="attention",
    equivalent={"minus of `-2` dropped": "swapaxes(-1, 2) is swapaxes(-1, -2): attention's arrays are 4-d "
                                         "(B, h, T, d), whose axis 2 is axis -2"},
    name="attention", title="the backward of scaled dot-product attention", paper="Section 3.2.1, Eq. 1",
    names={"softmax_backward(dp, p)": "dS (the softmax's backward of dP)",
           "xp.where(masked, xp.asarray(0, dtype=ds.dtype), ds)": "dS with the masked scores' entries zeroed",
           "ds * scale": "dS * scale", "ds @ k": "dQ = dS K", "ds.swapaxes(-1, -2) @ q": "dK = dS^T Q",
           "dv": "dV = P^T dO", "dp": "dP = dO V^T"},
    symbols={"d_k": lambda a: a["q"].shape[-1], "T_q": lambda a: a["q"].shape[-2], "T_k": lambda a: a["k"].shape[-2],
             "h": lambda a: a["q"].shape[1], "B": lambda a: a["q"].shape[0]},
    entry_sets=lambda a, shape: {"masked": a["masked"]} if a["masked"] is not None and len(shape) == 4
    and shape[-1] == a["k"].shape[-2] else {},
    target=attention_backward, layer=ScaledDotProductAttention, cases=cases, outputs=("dq", "dk", "dv"),
    show=(attention_forward,), swap="ScaledDotProductAttention",
    imports=("from numformer.layers.softmax import softmax_backward  # exercise 3's function, yours to use",),
    mistakes=(scale_missing, masked_scores_keep_gradient, softmax_without_row_sum, dq_dk_swapped,
              transpose_missing_in_dv, dropout_ignored),
    notes="Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v), p and p_used (B, h, Tq, Tk); masked "
          "is True where a score was replaced by -1e9 (broadcastable to p), or None; scale = 1/sqrt(d_k). "
          "dropout_backward is the attention dropout's backward (call it on a (B, h, Tq, Tk) gradient) or None "
          "when there is no attention dropout; p_used is dropout(P), or P itself. Batched matmuls (@) and "
          ".swapaxes(-1, -2) do every head at once: no loop.",
    forward="""
        The forward, Eq. 1, for every batch entry and head at once (Section 3.2.1):

            S      = Q K^T * scale                 scale = 1/sqrt(d_k); S (Tq, Tk): query i against key j
            S_ij   = -1e9  where masked_ij         the score is replaced (not added to): a constant
            P      = softmax(S)                    over the last axis, the keys: each row of P sums to 1
            P_used = dropout(P)                    attention dropout (not in the paper), or P itself
            O      = P_used V                      O (Tq, d_v)

        Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v); p and p_used (B, h, Tq, Tk);
        dout and O (B, h, Tq, d_v). The matrix products act on the last two axes, batched over (B, h).

        Your function receives dout = dL/dO (B, h, Tq, d_v) and what the forward kept: q, k, v; p, the
        softmax's output P; p_used, the weights that multiplied V (dropout(P), or P itself when there is no
        attention dropout); masked, a boolean array broadcastable to (B, h, Tq, Tk), True where a score was
        replaced by -1e9 (the mask's False entries; a row may be masked entirely), or None; scale, the
        1/sqrt(d_k) of the forward; dropout_backward, the attention dropout's backward (call it on a gradient
        of shape (B, h, Tq, Tk): it returns the gradient of dropout's input), or None when there is no
        attention dropout. It returns (dq, dk, dv), the gradients of q, k and v, with their shapes.

        softmax_backward(dy, y), imported above (exercise 3), is yours to use: given y = softmax(x) over the
        last axis and dy = dL/dy, it returns dL/dx.""",
    returns="Return (dq, dk, dv): dL/dQ (B, h, Tq, d_k), dL/dK (B, h, Tk, d_k) and dL/dV (B, h, Tk, d_v), from "
            "dout = dL/dO (B, h, Tq, d_v) and the forward's q, k, v, p, p_used, masked, scale and dropout.",
    steps=("Start at the end, O = P_used V, per batch entry and head: O_ic = sum_j P_used_ij V_jc. V_jc is "
           "multiplied by P_used_ij for every query i, so dV_jc = sum_i P_used_ij dO_ic: dV = P_used^T dO, "
           "(Tk, Tq) times (Tq, d_v). The transpose appears because V's row index j is P_used's column index. "
           "Use p_used here, the weights that actually multiplied V, not p.",
           "The same product gives the weights' gradient: dP_used_ij = sum_c dO_ic V_jc, i.e. dO V^T "
           "(Tq, Tk). P_used = dropout(P), so the gradient of P is dropout_backward of that when there is "
           "attention dropout (a dropped weight passed nothing on, a kept one was scaled by 1/(1 - p)), and "
           "that gradient itself when dropout_backward is None.",
           "Through the softmax, one row i at a time (each row of S is normalised on its own): dP_ij/dS_ik = "
           "P_ij (delta_jk - P_ik), so dS_ik = sum_j dP_ij P_ij (delta_jk - P_ik) = P_ik (dP_ik - sum_j "
           "dP_ij P_ij). The row sum is not optional: every score of the row moves every weight. This is "
           "exactly softmax_backward(dP, P), with P the softmax's output p, never p_used.",
           "The mask: a masked score was replaced by the constant -1e9, so it does not depend on Q or K and "
           "its gradient is exactly 0. Set dS to 0 where masked is True. It matters: a fully masked row is a "
           "uniform P (1/Tk) and the softmax's backward gives it non-zero entries. Then the scale: S = scale * "
           "(Q K^T), so the gradient of the product Q K^T is scale * dS.",
           "Last, the product Q K^T: S_ij = scale * sum_c Q_ic K_jc. Q_ic meets every key j: dQ = dS K * "
           "scale (Tq, Tk)(Tk, d_k); K_jc meets every query i: dK = dS^T Q * scale (Tk, Tq)(Tq, d_k). So the "
           "whole backward: dV = P_used^T dO; dP = dropout'(dO V^T); dS = P * (dP - rowsum(dP * P)); dS[masked] "
           "= 0; dQ = dS K * scale; dK = dS^T Q * scale. In NumPy, batched over (B, h) with @, a transpose of "
           "the last two axes is .swapaxes(-1, -2) (p_used.swapaxes(-1, -2) @ dout, dout @ v.swapaxes(-1, -2)), "
           "the mask is np.where(masked, 0, ds) (masked broadcasts; skip it when masked is None), and the "
           "return is (dq, dk, dv) in that order. No loop over heads."))
