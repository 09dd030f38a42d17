"""Exercise 12 of 18: the backward of scaled dot-product attention (Section 3.2.1, Eq. 1). Level: derive.

The forward, Eq. 1, for every batch entry and head at once (Section 3.2.1):

    S      = Q K^T * scale                 scale = 1/sqrt(d_k); S (Tq, Tk): query i against key j
    S_ij   = -1e9  where masked_ij         the score is replaced (not added to): a constant
    P      = softmax(S)                    over the last axis, the keys: each row of P sums to 1
    P_used = dropout(P)                    attention dropout (not in the paper), or P itself
    O      = P_used V                      O (Tq, d_v)

Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v); p and p_used (B, h, Tq, Tk); dout
and O (B, h, Tq, d_v). The matrix products act on the last two axes, batched over (B, h).

Your function receives dout = dL/dO (B, h, Tq, d_v) and what the forward kept: q, k, v; p, the
softmax's output P; p_used, the weights that multiplied V (dropout(P), or P itself when there is no
attention dropout); masked, a boolean array broadcastable to (B, h, Tq, Tk), True where a score was
replaced by -1e9 (the mask's False entries; a row may be masked entirely), or None; scale, the
1/sqrt(d_k) of the forward; dropout_backward, the attention dropout's backward (call it on a
gradient of shape (B, h, Tq, Tk): it returns the gradient of dropout's input), or None when there is
no attention dropout. It returns (dq, dk, dv), the gradients of q, k and v, with their shapes.

softmax_backward(dy, y), imported above (exercise 3), is yours to use: given y = softmax(x) over the
last axis and dy = dL/dy, it returns dL/dx.

Your part: derive the backward pass on paper from the forward above, then write the body of
attention_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_attention.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_attention.py

When it checks exact, train with it (every ScaledDotProductAttention numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap ScaledDotProductAttention=bench/held_out_grading_6/answers/my_attention.py:ScaledDotProductAttention
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap ScaledDotProductAttention=bench/held_out_grading_6/answers/my_attention.py:ScaledDotProductAttention
"""

import numpy as np

from numformer.layers.softmax import softmax_backward  # exercise 3's function, yours to use
from numformer.layers.attention import ScaledDotProductAttention as NumformerScaledDotProductAttention
from numformer.swap import using

EXERCISE = "attention"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.attention.attention_forward:
# def attention_forward(q, k, v, masked, scale: float, dropout=None):
#     """Eq. 1 -> (O, P, P_used).
#
#     ``S = Q K^T * scale``; ``S[masked] = -1e9``; ``P = softmax(S)``; ``O = dropout(P) V``.
#     q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v); ``masked`` bool, True where a
#     score is replaced, broadcastable to (B, h, Tq, Tk), or None; ``dropout`` a callable on
#     P (attention dropout, not in the paper) or None. O (B, h, Tq, d_v); P (B, h, Tq, Tk).
#     """
#     xp = get_array_module(q)
#     s = (q @ k.swapaxes(-1, -2)) * scale
#     if masked is not None:
#         s = xp.where(masked, xp.asarray(MASKED_SCORE, dtype=s.dtype), s)
#     p = softmax(s)
#     p_used = p if dropout is None else dropout(p)
#     return p_used @ v, p, p_used
#
# numformer.layers.attention.ScaledDotProductAttention.forward:
# def forward(self, q, k, v, mask=None):
#     xp = get_array_module(q)
#     masked = None if mask is None else ~xp.asarray(mask)  # a host mask with device arrays is moved
#     scale = 1.0 / math.sqrt(q.shape[-1])
#     dropout = self.dropout if self.dropout.active() else None
#     out, p, p_used = kernel(attention_forward)(q, k, v, masked, scale, dropout)
#     if self.record_weights:
#         self.weights = p
#     self.save_for_backward(q=q, k=k, v=v, p=p, p_used=p_used, masked=masked, scale=scale, dropout=dropout)
#     return out
#
# numformer.layers.attention.ScaledDotProductAttention.backward:
# def backward(self, dout):
#     q, k, v, p, p_used, masked, scale, dropout = self.pop_saved("q", "k", "v", "p", "p_used", "masked", "scale",
#                                                                 "dropout")
#     return kernel(attention_backward)(dout, q, k, v, p, p_used, masked, scale,
#                                       None if dropout is None else dropout.backward)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def attention_backward(dout, q, k, v, p, p_used, masked, scale: float, dropout_backward=None):
    """Return (dq, dk, dv): dL/dQ (B, h, Tq, d_k), dL/dK (B, h, Tk, d_k) and dL/dV (B, h, Tk, d_v),
    from dout = dL/dO (B, h, Tq, d_v) and the forward's q, k, v, p, p_used, masked, scale and
    dropout."""
    dv = np.einsum("bhqk,bhqd->bhkd", p_used, dout)
    dpu = np.einsum("bhqd,bhkd->bhqk", dout, v)
    dp = dpu if dropout_backward is None else dropout_backward(dpu)
    row = np.einsum("bhqk,bhqk->bhq", dp, p)[..., None]
    ds = p * (dp - row)
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds *= scale
    dq = np.einsum("bhqk,bhkd->bhqd", ds, k)
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q)
    return dq, dk, dv


# numformer's ScaledDotProductAttention, its methods calling your attention_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
ScaledDotProductAttention = using(NumformerScaledDotProductAttention, attention_backward=attention_backward)
