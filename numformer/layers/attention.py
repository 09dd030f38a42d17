"""Scaled dot-product attention (Section 3.2.1, Eq. 1) and multi-head attention (Section 3.2.2).

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``
``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O``, ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``

Masks are boolean, True where a query may attend to a key, broadcastable to
(batch, heads, time_q, time_k). Masked scores are *replaced* by -1e9 before the
softmax (not added to), so their gradient is exactly zero, and a row whose keys
are all masked becomes a uniform average instead of NaN.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module, is_cupy_array
from ..module import Module
from .dropout import Dropout
from .linear import Linear
from .softmax import Softmax

MASKED_SCORE = -1e9


def _masked_positions(mask):
    """``~mask`` (True where a score is replaced), or None when nothing is masked.

    The all-allowed test runs on the CPU only (on the GPU it would force a sync).
    """
    if mask is None:
        return None
    masked = ~mask
    if not is_cupy_array(masked) and not masked.any():
        return None
    return masked


class ScaledDotProductAttention(Module):
    """Eq. 1 over batched heads.

    Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v),
    mask broadcastable to (B, h, Tq, Tk) -> out (B, h, Tq, d_v).
    Optional dropout on the attention weights (not in the paper; off by default).
    """

    def __init__(self, dropout: float = 0.0, rng=None):
        super().__init__()
        self.softmax = Softmax()
        self.dropout = Dropout(dropout, rng)
        self.weights = None  # last attention weights, kept only when record_weights is set
        self.record_weights = False
        self._cache = None

    def forward(self, q, k, v, mask=None):
        xp = get_array_module(q)
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = q @ k.swapaxes(-1, -2)
        scores *= scale
        masked = _masked_positions(mask)
        if masked is not None:  # in place on the fresh scores buffer: no extra (B, h, Tq, Tk) array
            xp.copyto(scores, xp.asarray(MASKED_SCORE, dtype=scores.dtype), where=masked)
        p = self.softmax(scores)
        if self.record_weights:
            self.weights = p
        p_drop = self.dropout(p)
        out = p_drop @ v
        if self.training:
            self._cache = (q, k, v, p_drop, masked, scale)
        return out

    def backward(self, dout):
        """dout (B, h, Tq, d_v) -> (dq, dk, dv) with the shapes of q, k, v."""
        xp = get_array_module(dout)
        q, k, v, p_drop, masked, scale = self._cache
        self._cache = None
        dv = p_drop.swapaxes(-1, -2) @ dout
        dp = self.dropout.backward(dout @ v.swapaxes(-1, -2))
        dscores = self.softmax.backward(dp)
        if masked is not None:
            xp.copyto(dscores, xp.asarray(0, dtype=dscores.dtype), where=masked)
        dscores *= scale
        dq = dscores @ k
        dk = dscores.swapaxes(-1, -2) @ q
        return dq, dk, dv


class MultiHeadAttention(Module):
    """Multi-head attention with h heads, used three ways (Section 3.2.3).

    * self-attention: ``forward(x, mask=...)``; backward returns dx (B, T, d_model);
    * encoder-decoder attention: ``forward(x, memory, mask)``; queries from x
      (B, Tq, d_model), keys and values from memory (B, Tk, d_model); backward
      returns (dx, dmemory).

    Incremental decoding (eval mode only) passes ``cache``, a dict per layer:
    self-attention appends this step's keys/values to it; encoder-decoder
    attention projects the memory once and reuses it for every step.
    """

    def __init__(self, d_model: int, heads: int, d_k: int | None = None, d_v: int | None = None,
                 attn_dropout: float = 0.0, rng=None, dropout_rng=None, dtype=DEFAULT_DTYPE):
        super().__init__()
        if d_k is None:
            if d_model % heads:
                raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
            d_k = d_model // heads
        d_v = d_k if d_v is None else d_v
        rng = rng if rng is not None else np.random.default_rng(0)
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.w_q = Linear(d_model, heads * d_k, rng=rng, dtype=dtype)
        self.w_k = Linear(d_model, heads * d_k, rng=rng, dtype=dtype)
        self.w_v = Linear(d_model, heads * d_v, rng=rng, dtype=dtype)
        self.attention = ScaledDotProductAttention(attn_dropout, dropout_rng)
        self.w_o = Linear(heads * d_v, d_model, rng=rng, dtype=dtype)
        self._cache_cross = None

    def _split(self, x, d):
        """(B, T, h*d) -> (B, h, T, d)."""
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, d).transpose(0, 2, 1, 3)

    @staticmethod
    def _merge(x):
        """(B, h, T, d) -> (B, T, h*d) (contiguous)."""
        b, h, t, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)

    def forward(self, x, memory=None, mask=None, cache=None):
        """x (B, Tq, d_model), memory (B, Tk, d_model) or None -> (B, Tq, d_model)."""
        xp = get_array_module(x)
        cross = memory is not None
        kv_in = memory if cross else x
        q = self._split(self.w_q(x), self.d_k)
        if cache is None:
            k = self._split(self.w_k(kv_in), self.d_k)
            v = self._split(self.w_v(kv_in), self.d_v)
        elif cross:
            if "k" not in cache:
                cache["k"] = self._split(self.w_k(kv_in), self.d_k)
                cache["v"] = self._split(self.w_v(kv_in), self.d_v)
            k, v = cache["k"], cache["v"]
        else:
            k_new = self._split(self.w_k(x), self.d_k)
            v_new = self._split(self.w_v(x), self.d_v)
            if "k" in cache:
                k_new = xp.concatenate([cache["k"], k_new], axis=2)
                v_new = xp.concatenate([cache["v"], v_new], axis=2)
            cache["k"], cache["v"] = k_new, v_new
            k, v = k_new, v_new
        heads_out = self.attention(q, k, v, mask)
        if self.training:
            self._cache_cross = cross
        return self.w_o(self._merge(heads_out))

    def backward(self, dy):
        """dy (B, Tq, d_model) -> dx (self-attention) or (dx, dmemory) (encoder-decoder)."""
        cross = self._cache_cross
        self._cache_cross = None
        d_heads = self._split(self.w_o.backward(dy), self.d_v)
        dq, dk, dv = self.attention.backward(d_heads)
        dx = self.w_q.backward(self._merge(dq))
        dkv = self.w_k.backward(self._merge(dk))
        dkv += self.w_v.backward(self._merge(dv))
        if cross:
            return dx, dkv
        dx += dkv
        return dx
