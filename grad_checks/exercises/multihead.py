"""Exercise: the backward of multi-head attention (Section 3.2.2), self and encoder-decoder."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
from numformer.layers.attention import MultiHeadAttention

from ..cases import B, D, HEADS, S, T, padded_batch
from ..exercise import Exercise, named_gradients


def key_value_paths_dropped(self, dy):
    """In self-attention x also makes the keys and values: dx = dx_from_Q + dx_from_K + dx_from_V, not the query path alone."""
    dq, dk, dv = self.attention.backward(self._split(self.w_o.backward(dy)))
    dx = self.w_q.backward(self._merge(dq))
    dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))
    if self._cross:
        return dx, dkv
    return dx


def heads_merged_without_transpose(self, dy):
    """The heads' gradients are reshaped to (B, T, h*d) without moving the head axis back: use the transpose of _split."""
    dq, dk, dv = self.attention.backward(self._split(self.w_o.backward(dy)))

    def merge(g):
        b, h, t, d = g.shape
        return g.reshape(b, t, h * d)
    dx = self.w_q.backward(merge(dq))
    dkv = self.w_k.backward(merge(dk)) + self.w_v.backward(merge(dv))
    return (dx, dkv) if self._cross else dx + dkv


def split_without_transpose(self, dy):
    """dO is reshaped to (B, h, T, d) without the transpose forward used: split it like forward did (_split)."""
    g = self.w_o.backward(dy)
    b, t, hd = g.shape
    dq, dk, dv = self.attention.backward(g.reshape(b, self.heads, t, hd // self.heads))
    dx = self.w_q.backward(self._merge(dq))
    dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))
    return (dx, dkv) if self._cross else dx + dkv


def key_and_value_gradients_swapped(self, dy):
    """dK goes back through W^V and dV through W^K: each projection's backward takes the gradient of its own output."""
    dq, dk, dv = self.attention.backward(self._split(self.w_o.backward(dy)))
    dx = self.w_q.backward(self._merge(dq))
    dkv = self.w_k.backward(self._merge(dv)) + self.w_v.backward(self._merge(dk))
    return (dx, dkv) if self._cross else dx + dkv


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for name, t, mask in [("self, padding mask", S, src_mask), ("self, causal + padding", T, tgt_mask)]:
        m = cls(D, HEADS, rng=rng, dtype=np.float64)
        out.append(GradCase("MultiHeadAttention", name, m, {"x": rng.standard_normal((B, t, D))},
                            lambda m, i, mask=mask: m(i["x"], mask=mask), lambda m, g: {"x": m.backward(g[0])}))
    # another number of heads than the first two cases' (a head count kept from the first call shows)
    m = cls(D, 2, d_k=3, d_v=5, rng=rng, dtype=np.float64)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    out.append(GradCase("MultiHeadAttention", "encoder-decoder, 2 heads, d_k 3, d_v 5", m, ins,
                        lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                        lambda m, g: named_gradients(m.backward(g[0]), "MultiHeadAttention.backward", ("y", "memory"))))
    return out


EXERCISE = Exercise(
    stage="composition",
    name="multihead", title="the backward of multi-head attention", paper="Section 3.2.2",
    target=MultiHeadAttention.backward, layer=MultiHeadAttention, cases=cases,
    show=(MultiHeadAttention._split, MultiHeadAttention._merge, MultiHeadAttention.forward),
    mistakes=(key_value_paths_dropped, heads_merged_without_transpose, split_without_transpose,
              key_and_value_gradients_swapped),
    swap="MultiHeadAttention",
    notes="The children and what their backward returns: self.w_q, self.w_k, self.w_v and self.w_o are Linear "
          "maps (backward(g) returns the gradient of their input and adds dW, db into .grad); self.attention is "
          "the scaled dot-product attention (backward(dO) returns dq, dk, dv, each (B, h, T, d)). self._cross is "
          "True for encoder-decoder attention (forward got a memory): return (dx, dmemory) then, dx alone "
          "otherwise. self._split and self._merge are yours to use.",
    forward="""
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
        encoder-decoder attention x (B, Tq, d_model) makes the queries and memory (B, Tk, d_model) the keys and
        the values. self._split reshapes (B, T, h*d) to (B, T, h, d) and moves the head axis forward to (B, h,
        T, d); self._merge does the opposite, so _merge(_split(a)) is a again. The mask has no gradient, and
        in training no cache is passed (incremental decoding runs in eval mode only).

        Your method is MultiHeadAttention.backward(self, dy), dy = dL/dy (B, Tq, d_model); the forward above
        ran first, in training mode. The children and what their backward does: self.w_q, self.w_k, self.w_v
        and self.w_o are Linear maps (x W + b): backward(g) takes the gradient of the map's output and returns
        the gradient of its input, and adds dW and db into the weight's and bias's .grad itself (accumulated;
        nothing to do for the parameters here). self.attention is the scaled dot-product attention of the
        previous exercise: backward(g), g the gradient of its output (B, h, Tq, d_v), returns (dq, dk, dv),
        the gradients of its three inputs, shaped (B, h, Tq, d_k), (B, h, Tk, d_k) and (B, h, Tk, d_v). Each
        child's backward uses what its own forward cached, once: call it once per call forward made.
        self._cross is True when forward got a memory (encoder-decoder attention). Return dx (B, T, d_model)
        for self-attention; for encoder-decoder attention the tuple (dx, dmemory), dx (B, Tq, d_model) and
        dmemory (B, Tk, d_model). self._split and self._merge are yours to use.""",
    returns="Return dL/dx (B, T, d_model) for self-attention, or the tuple (dL/dx (B, Tq, d_model), dL/dmemory "
            "(B, Tk, d_model)) for encoder-decoder attention (self._cross), from dy = dL/dy (B, Tq, d_model).",
    steps=("Run the forward backwards, last operation first. y = C W^O + b^O is self.w_o: its backward takes dy "
           "and returns dC (B, Tq, h*d_v), the gradient of the concatenated heads (and adds dW^O, db^O itself).",
           "C is _merge of the heads: a rearrangement of the same numbers (a transpose and a reshape), no "
           "arithmetic. The backward of a rearrangement puts each gradient entry back where its number came "
           "from: the inverse rearrangement (a permutation matrix's transpose is its inverse). So the heads' "
           "gradient is _split of dC (B, h, Tq, d_v) (a plain reshape to (B, h, Tq, d_v) without the transpose "
           "pairs the wrong numbers), and self.attention's backward on it returns dq, dk, dv, per head.",
           "Back out of the heads the same way: the backward of _split is _merge, so _merge each of dq, dk, dv "
           "to (B, T, h*d) and take each through the backward of the projection that made it: dq through "
           "self.w_q, dk through self.w_k, dv through self.w_v (not swapped: each Linear's backward takes the "
           "gradient of its own output). Each returns a gradient of that projection's input.",
           "Where the paths meet: kv was used twice, by W^K and by W^V, so its gradient is the sum of the two "
           "paths. In self-attention kv is x, which was used three times (queries, keys and values): dx is the "
           "sum of all three. In encoder-decoder attention dx is the query path alone and dmemory the sum of "
           "the key and value paths.",
           "The whole backward: g = self.w_o.backward(dy); dq, dk, dv = self.attention.backward(self._split(g)); "
           "dx = self.w_q.backward(self._merge(dq)); dkv = self.w_k.backward(self._merge(dk)) + "
           "self.w_v.backward(self._merge(dv)); return (dx, dkv) if self._cross, else dx + dkv. Every head is "
           "done by the batched children at once: no loop over heads."))
