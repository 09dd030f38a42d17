"""Exercise 13 of 18: the backward of multi-head attention (Section 3.2.2). Level: derive.

The forward, Section 3.2.2 (MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i =
Attention(Q W_i^Q, K W_i^K, V W_i^V), Eq. 1 in each head), as numformer computes it: one Linear map
per projection makes all h heads at once, and kv is x itself in self-attention, the encoder's output
(memory) in encoder-decoder attention:

    Q = x  W^Q + b^Q                   (B, Tq, h*d_k)     self.w_q
    K = kv W^K + b^K                   (B, Tk, h*d_k)     self.w_k
    V = kv W^V + b^V                   (B, Tk, h*d_v)     self.w_v
    split(Q), split(K), split(V)       (B, h, T, d)       self._split: head i's Q_i, K_i, V_i are
                                                          the columns i*d .. (i+1)*d - 1
    head_i = Attention(Q_i, K_i, V_i)  (B, h, Tq, d_v)    self.attention: all heads, the mask
    C = Concat(head_1, ..., head_h)    (B, Tq, h*d_v)     self._merge
    y = C W^O + b^O                    (B, Tq, d_model)   self.w_o

In self-attention x (B, T, d_model) makes the queries, the keys and the values (Tq = Tk = T); in
encoder-decoder attention x (B, Tq, d_model) makes the queries and memory (B, Tk, d_model) the keys
and the values. self._split reshapes (B, T, h*d) to (B, T, h, d) and moves the head axis forward to
(B, h, T, d); self._merge does the opposite, so _merge(_split(a)) is a again. The mask has no
gradient, and in training no cache is passed (incremental decoding runs in eval mode only).

Your method is MultiHeadAttention.backward(self, dy), dy = dL/dy (B, Tq, d_model); the forward above
ran first, in training mode. The children and what their backward does: self.w_q, self.w_k, self.w_v
and self.w_o are Linear maps (x W + b): backward(g) takes the gradient of the map's output and
returns the gradient of its input, and adds dW and db into the weight's and bias's .grad itself
(accumulated; nothing to do for the parameters here). self.attention is the scaled dot-product
attention of the previous exercise: backward(g), g the gradient of its output (B, h, Tq, d_v),
returns (dq, dk, dv), the gradients of its three inputs, shaped (B, h, Tq, d_k), (B, h, Tk, d_k) and
(B, h, Tk, d_v). Each child's backward uses what its own forward cached, once: call it once per call
forward made. self._cross is True when forward got a memory (encoder-decoder attention). Return dx
(B, T, d_model) for self-attention; for encoder-decoder attention the tuple (dx, dmemory), dx (B,
Tq, d_model) and dmemory (B, Tk, d_model). self._split and self._merge are yours to use.

Your part: derive the backward pass on paper from the forward above, then write the body of
MultiHeadAttention.backward below, replacing its `raise NotImplementedError`. The arrays are float64
when graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_multihead.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_multihead.py

When it checks exact, train with it (every MultiHeadAttention numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap MultiHeadAttention=bench/held_out_grading_6/answers/my_multihead.py:MultiHeadAttention
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap MultiHeadAttention=bench/held_out_grading_6/answers/my_multihead.py:MultiHeadAttention
"""

import numpy as np

from numformer.layers.attention import MultiHeadAttention as NumformerMultiHeadAttention

EXERCISE = "multihead"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.attention.MultiHeadAttention._split:
# def _split(self, x):
#     """(B, T, h*d) -> (B, h, T, d) (a view)."""
#     b, t, hd = x.shape
#     return x.reshape(b, t, self.heads, hd // self.heads).transpose(0, 2, 1, 3)
#
# numformer.layers.attention.MultiHeadAttention._merge:
# @staticmethod
# def _merge(x):
#     """(B, h, T, d) -> (B, T, h*d): Concat(head_1..head_h) (free when x is a view of that layout)."""
#     b, h, t, d = x.shape
#     return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)
#
# numformer.layers.attention.MultiHeadAttention.forward:
# def forward(self, x, memory=None, mask=None, cache: KVCache | None = None):
#     """x (B, Tq, d_model), memory (B, Tk, d_model) or None -> (B, Tq, d_model); ``cache`` when decoding."""
#     self._cross = memory is not None
#     q = self._split(self.w_q(x))
#     if not self._cross:
#         k, v = self._split(self.w_k(x)), self._split(self.w_v(x))
#         if cache is not None:  # decoding: this step's keys/values join the earlier ones
#             k, v = cache.append(k, v)
#     elif cache is not None and not cache.empty:  # decoding: the memory was projected at the first step
#         k, v = cache.k, cache.v
#     else:
#         k, v = self._split(self.w_k(memory)), self._split(self.w_v(memory))
#         if cache is not None:
#             cache.store(k, v)
#     return self.w_o(self._merge(self.attention(q, k, v, mask)))


class MultiHeadAttention(NumformerMultiHeadAttention):
    """numformer's MultiHeadAttention (its __init__, forward and children), with your backward."""

    def backward(self, dy):
        """Return dL/dx (B, T, d_model) for self-attention, or the tuple (dL/dx (B, Tq, d_model),
        dL/dmemory (B, Tk, d_model)) for encoder-decoder attention (self._cross), from dy = dL/dy
        (B, Tq, d_model)."""
        d_concat = self.w_o.backward(dy)
        dq, dk, dv = self.attention.backward(self._split(d_concat))
        d_from_q, d_from_k, d_from_v = (proj.backward(self._merge(g))
                                        for proj, g in ((self.w_q, dq), (self.w_k, dk), (self.w_v, dv)))
        d_source = d_from_k + d_from_v
        return (d_from_q, d_source) if self._cross else d_from_q + d_source
