"""Scaled dot-product attention (Section 3.2.1, Eq. 1) and multi-head attention (Section 3.2.2).

``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``
``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O``, ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``

Masks are boolean, True where a query may attend to a key, broadcastable to
(batch, heads, time_q, time_k). Masked scores are *replaced* by -1e9 before the
softmax (not added to), so their gradient is exactly zero, and a row whose keys
are all masked becomes a uniform average instead of NaN (and gets no gradient).

Forward mode (numformer/forward_mode.py) and the backward's tangent (Pearlmutter's R-operator) follow each
line by the product rule: a masked score is a constant, so its tangent is zero as its gradient is; the
heads' split and merge are reshapes, so tangents split and merge alike.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import DEFAULT_DTYPE, MASKED_SCORE, get_array_module
from ..kernels import kernel
from ..module import Module
from .init import DEFAULT_SCHEME
from .kv_cache import KVCache
from .registry import layer_class, registered
from .softmax import softmax, softmax_backward, softmax_backward_jvp, softmax_jvp


def attention_forward(q, k, v, masked, scale: float, dropout=None):
    """Eq. 1 -> (O, P, P_used).

    ``S = Q K^T * scale``; ``S[masked] = -1e9``; ``P = softmax(S)``; ``O = dropout(P) V``.
    q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v); ``masked`` bool, True where a
    score is replaced, broadcastable to (B, h, Tq, Tk), or None; ``dropout`` a callable on
    P (attention dropout, not in the paper) or None. O (B, h, Tq, d_v); P (B, h, Tq, Tk).
    """
    xp = get_array_module(q)
    s = (q @ k.swapaxes(-1, -2)) * scale
    if masked is not None:
        s = xp.where(masked, xp.asarray(MASKED_SCORE, dtype=s.dtype), s)
    p = softmax(s)
    p_used = p if dropout is None else dropout(p)
    return p_used @ v, p, p_used


def attention_backward(dout, q, k, v, p, p_used, masked, scale: float, dropout_backward=None):
    """Backward of Eq. 1 -> (dQ, dK, dV), the shapes of q, k, v.

    ``dV = P_used^T dO``; ``dP = dropout'(dO V^T)``; ``dS = P * (dP - rowsum(dP * P))``;
    ``dS[masked] = 0``; ``dQ = dS K * scale``; ``dK = dS^T Q * scale``.
    """
    xp = get_array_module(dout)
    dv = p_used.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    ds = softmax_backward(dp, p)
    if masked is not None:
        ds = xp.where(masked, xp.asarray(0, dtype=ds.dtype), ds)
    ds = ds * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def attention_jvp(q, k, v, p, p_used, masked, scale: float, q_dot, k_dot, v_dot, dropout_jvp=None):
    """Forward mode of Eq. 1 -> (O_dot, P_dot, P_used_dot), the shapes of O, P, P_used.

    ``S_dot = (Q_dot K^T + Q K_dot^T) * scale``; ``S_dot[masked] = 0``; ``P_dot = P * (S_dot - rowsum(S_dot * P))``;
    ``P_used_dot = dropout(P_dot)`` with the forward's mask; ``O_dot = P_used_dot V + P_used V_dot``.
    """
    xp = get_array_module(q)
    s_dot = (q_dot @ k.swapaxes(-1, -2) + q @ k_dot.swapaxes(-1, -2)) * scale
    if masked is not None:
        s_dot = xp.where(masked, xp.asarray(0, dtype=s_dot.dtype), s_dot)
    p_dot = softmax_jvp(s_dot, p)
    p_used_dot = p_dot if dropout_jvp is None else dropout_jvp(p_dot)
    return p_used_dot @ v + p_used @ v_dot, p_dot, p_used_dot


def attention_backward_jvp(dout, dout_dot, q, k, v, p, p_used, masked, scale: float, q_dot, k_dot, v_dot, p_dot,
                           p_used_dot, dropout_backward_jvp=None):
    """The backward of Eq. 1 and its tangent -> ((dQ, dK, dV), (dQ_dot, dK_dot, dV_dot)).

    Each line of :func:`attention_backward`, its tangent beside it:
    ``dV = P_used^T dO``;  ``dV_dot = P_used_dot^T dO + P_used^T dO_dot``;
    ``dP = dropout'(dO V^T)``;  ``dP_dot = dropout'(dO_dot V^T + dO V_dot^T)``;
    ``dS = P * (dP - rowsum(dP * P))``, 0 where masked, times scale;  ``dS_dot``, its tangent (softmax_backward_jvp),
    0 where masked, times scale;  ``dQ_dot = dS_dot K + dS K_dot``;  ``dK_dot = dS_dot^T Q + dS^T Q_dot``.
    """
    xp = get_array_module(dout)
    dv = p_used.swapaxes(-1, -2) @ dout
    dv_dot = p_used_dot.swapaxes(-1, -2) @ dout + p_used.swapaxes(-1, -2) @ dout_dot
    dp = dout @ v.swapaxes(-1, -2)
    dp_dot = dout_dot @ v.swapaxes(-1, -2) + dout @ v_dot.swapaxes(-1, -2)
    if dropout_backward_jvp is not None:
        dp, dp_dot = dropout_backward_jvp(dp, dp_dot)
    ds, ds_dot = softmax_backward(dp, p), softmax_backward_jvp(dp, dp_dot, p, p_dot)
    if masked is not None:
        zero = xp.asarray(0, dtype=ds.dtype)
        ds, ds_dot = xp.where(masked, zero, ds), xp.where(masked, zero, ds_dot)
    ds, ds_dot = ds * scale, ds_dot * scale
    return ((ds @ k, ds.swapaxes(-1, -2) @ q, dv),
            (ds_dot @ k + ds @ k_dot, ds_dot.swapaxes(-1, -2) @ q + ds.swapaxes(-1, -2) @ q_dot, dv_dot))


@registered
class ScaledDotProductAttention(Module):
    """Eq. 1 over batched heads.

    Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v),
    mask broadcastable to (B, h, Tq, Tk) -> out (B, h, Tq, d_v).
    Optional dropout on the attention weights (not in the paper; off by default).
    Saved for backward: ``q``, ``k``, ``v``, ``p`` (the weights), ``p_used`` (after dropout), ``masked``,
    ``scale`` and ``dropout`` (the layer whose mask backward replays, or None); by jvp: ``q``, ``k``, ``v``,
    ``p``, ``p_used``, their tangents.
    """

    kinks = False  # matmuls and a softmax; its dropout is a child (Module.kinks: the layer contract)

    def __init__(self, dropout: float = 0.0, rng=None):
        super().__init__()
        self.dropout = layer_class("Dropout")(dropout, rng)
        self.weights = None  # last attention weights, kept only when record_weights is set
        self.record_weights = False

    def forward(self, q, k, v, mask=None):
        xp = get_array_module(q)
        masked = None if mask is None else ~xp.asarray(mask)  # a host mask with device arrays is moved
        scale = 1.0 / math.sqrt(q.shape[-1])
        dropout = self.dropout if self.dropout.active() else None
        out, p, p_used = kernel(attention_forward)(q, k, v, masked, scale, dropout)
        if self.record_weights:
            self.weights = p
        self.save_for_backward(q=q, k=k, v=v, p=p, p_used=p_used, masked=masked, scale=scale, dropout=dropout)
        return out

    def backward(self, dout):
        """dout (B, h, Tq, d_v) -> (dq, dk, dv) with the shapes of q, k, v."""
        q, k, v, p, p_used, masked, scale, dropout = self.pop_saved("q", "k", "v", "p", "p_used", "masked", "scale",
                                                                    "dropout")
        return kernel(attention_backward)(dout, q, k, v, p, p_used, masked, scale,
                                          None if dropout is None else dropout.backward)

    def jvp(self, q_dot, k_dot, v_dot):
        """The tangents of q, k, v -> out_dot (B, h, Tq, d_v)."""
        q, k, v, p, p_used, masked, scale, dropout = self.peek_saved("q", "k", "v", "p", "p_used", "masked",
                                                                     "scale", "dropout")
        out_dot, p_dot, p_used_dot = attention_jvp(q, k, v, p, p_used, masked, scale, q_dot, k_dot, v_dot,
                                                   None if dropout is None else dropout.jvp)
        self.save_tangents(q=q_dot, k=k_dot, v=v_dot, p=p_dot, p_used=p_used_dot)
        return out_dot

    def backward_jvp(self, dout, dout_dot):
        """-> ((dq, dk, dv), (dq_dot, dk_dot, dv_dot))."""
        q, k, v, p, p_used, masked, scale, dropout = self.pop_saved("q", "k", "v", "p", "p_used", "masked", "scale",
                                                                    "dropout")
        q_dot, k_dot, v_dot, p_dot, p_used_dot = self.pop_tangents("q", "k", "v", "p", "p_used")
        return attention_backward_jvp(dout, dout_dot, q, k, v, p, p_used, masked, scale, q_dot, k_dot, v_dot, p_dot,
                                      p_used_dot, None if dropout is None else dropout.backward_jvp)


@registered
class MultiHeadAttention(Module):
    """Multi-head attention with h heads, used three ways (Section 3.2.3).

    * self-attention: ``forward(x, mask=...)``; backward returns dx (B, T, d_model);
    * encoder-decoder attention: ``forward(x, memory, mask)``; queries from x
      (B, Tq, d_model), keys and values from memory (B, Tk, d_model); backward
      returns (dx, dmemory).

    ``Q = x W^Q``, ``K = kv W^K``, ``V = kv W^V`` (the Linear children ``w_q``, ``w_k``,
    ``w_v``; all heads in one map), split into h heads of d_k (a view, no copy);
    ``O = Attention(Q, K, V)`` per head; heads concatenated and mapped by ``w_o``.

    Incremental decoding (eval mode only) passes ``cache``, this attention's
    :class:`~numformer.layers.kv_cache.KVCache`: self-attention appends this step's
    keys/values to it (``cache.k``, ``cache.v``: (B, h, T, d) views of buffers that grow
    by doubling, so a step writes one position instead of copying the whole prefix);
    encoder-decoder attention projects the memory once and reuses it for every step.
    """

    kinks = False  # reshapes; its projections and attention are children (Module.kinks: the layer contract)

    def __init__(self, d_model: int, heads: int, d_k: int | None = None, d_v: int | None = None,
                 attn_dropout: float = 0.0, rng=None, dropout_rng=None, dtype=DEFAULT_DTYPE,
                 init: str = DEFAULT_SCHEME):
        super().__init__()
        if d_k is None:
            if d_model % heads:
                raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
            d_k = d_model // heads
        d_v = d_k if d_v is None else d_v
        rng = rng if rng is not None else np.random.default_rng(0)
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.w_q = layer_class("Linear")(d_model, heads * d_k, rng=rng, dtype=dtype, init=init, role="qkv")
        self.w_k = layer_class("Linear")(d_model, heads * d_k, rng=rng, dtype=dtype, init=init, role="qkv")
        self.w_v = layer_class("Linear")(d_model, heads * d_v, rng=rng, dtype=dtype, init=init, role="qkv")
        self.attention = layer_class("ScaledDotProductAttention")(attn_dropout, dropout_rng)
        self.w_o = layer_class("Linear")(heads * d_v, d_model, rng=rng, dtype=dtype, init=init, role="out")
        self._cross = False

    @classmethod
    def from_config(cls, cfg, rng=None, dropout_rng=None, dtype=DEFAULT_DTYPE):
        """The multi-head attention of a model config (numformer.presets.ModelConfig: ``d_model``, ``heads``,
        ``d_k``, ``d_v``, ``attn_dropout``, ``init``); weights drawn from ``rng``, the attention dropout's masks
        from ``dropout_rng``."""
        return cls(cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, cfg.attn_dropout, rng, dropout_rng, dtype, cfg.init)

    def _split(self, x):
        """(B, T, h*d) -> (B, h, T, d) (a view)."""
        b, t, hd = x.shape
        return x.reshape(b, t, self.heads, hd // self.heads).transpose(0, 2, 1, 3)

    @staticmethod
    def _merge(x):
        """(B, h, T, d) -> (B, T, h*d): Concat(head_1..head_h) (free when x is a view of that layout)."""
        b, h, t, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)

    def forward(self, x, memory=None, mask=None, cache: KVCache | None = None):
        """x (B, Tq, d_model), memory (B, Tk, d_model) or None -> (B, Tq, d_model); ``cache`` when decoding."""
        self._cross = memory is not None
        q = self._split(self.w_q(x))
        if not self._cross:
            k, v = self._split(self.w_k(x)), self._split(self.w_v(x))
            if cache is not None:  # decoding: this step's keys/values join the earlier ones
                k, v = cache.append(k, v)
        elif cache is not None and not cache.empty:  # decoding: the memory was projected at the first step
            k, v = cache.k, cache.v
        else:
            k, v = self._split(self.w_k(memory)), self._split(self.w_v(memory))
            if cache is not None:
                cache.store(k, v)
        return self.w_o(self._merge(self.attention(q, k, v, mask)))

    def backward(self, dy):
        """dy (B, Tq, d_model) -> dx (self-attention) or (dx, dmemory) (encoder-decoder)."""
        dq, dk, dv = self.attention.backward(self._split(self.w_o.backward(dy)))
        dx = self.w_q.backward(self._merge(dq))
        dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))
        if self._cross:
            return dx, dkv
        return dx + dkv

    def jvp(self, x_dot, memory_dot=None):
        """x_dot (B, Tq, d_model), memory_dot (B, Tk, d_model) (encoder-decoder attention) -> y_dot (B, Tq, d_model),
        with the projections' tangents."""
        q_dot = self._split(self.w_q.jvp(x_dot))
        kv_dot = memory_dot if self._cross else x_dot
        k_dot, v_dot = self._split(self.w_k.jvp(kv_dot)), self._split(self.w_v.jvp(kv_dot))
        return self.w_o.jvp(self._merge(self.attention.jvp(q_dot, k_dot, v_dot)))

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot) (self-attention) or ((dx, dmemory), (dx_dot, dmemory_dot)) (encoder-decoder)."""
        do, do_dot = self.w_o.backward_jvp(dy, dy_dot)
        (dq, dk, dv), (dq_dot, dk_dot, dv_dot) = self.attention.backward_jvp(self._split(do), self._split(do_dot))
        dx, dx_dot = self.w_q.backward_jvp(self._merge(dq), self._merge(dq_dot))
        dk_in, dk_in_dot = self.w_k.backward_jvp(self._merge(dk), self._merge(dk_dot))
        dv_in, dv_in_dot = self.w_v.backward_jvp(self._merge(dv), self._merge(dv_dot))
        dkv, dkv_dot = dk_in + dv_in, dk_in_dot + dv_in_dot
        if self._cross:
            return (dx, dkv), (dx_dot, dkv_dot)
        return dx + dkv, dx_dot + dkv_dot
