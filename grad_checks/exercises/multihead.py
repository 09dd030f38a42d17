"""Exercise: the backward of multi-head attention (Section 3.2.2), self and encoder-decoder."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
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
    m = cls(D, HEADS, d_k=3, d_v=5, rng=rng, dtype=np.float64)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    out.append(GradCase("MultiHeadAttention", "encoder-decoder, d_k 3, d_v 5", m, ins,
                        lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                        lambda m, g: named_gradients(m.backward(g[0]), "MultiHeadAttention.backward", ("y", "memory"))))
    return out


EXERCISE = Exercise(
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
          "otherwise. self._split and self._merge are yours to use.")
