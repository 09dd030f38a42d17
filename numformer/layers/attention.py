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

from ..backend import DEFAULT_DTYPE, get_array_module, is_cupy_array, parallel_ranges
from ..module import Module
from ..precision import matmul
from .dropout import Dropout
from .linear import Linear, add_bias_
from .softmax import Softmax, softmax_, softmax_backward_

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


def _batch_rows(a, i: int, j: int):
    """Batch rows i:j of a (B, ...) array, or the array itself where it is broadcast over the batch."""
    if a is None or a.ndim < 4 or a.shape[0] == 1:
        return a
    return a[i:j]


BLAS_SMALL_GEMM = 1 << 18  # m*n*k up to which OpenBLAS runs a GEMM on the calling thread only


def _threads_pay(tq: int, tk: int, dk: int, dv: int) -> bool:
    """Split the batch over host threads only when every per-head GEMM is small enough that
    OpenBLAS would run it single-threaded anyway (bigger ones it threads itself)."""
    return tq * tk * max(dk, dv) <= BLAS_SMALL_GEMM


def _cache_append(cache: dict, k_new, v_new):
    """Append (B, h, t, d) keys/values to a self-attention cache; returns the (B, h, T, d) views so far.

    The cache holds ``kbuf``/``vbuf`` (B, h, capacity, d) buffers, doubled when full, and
    ``k``/``v`` views of their first T positions (:meth:`Transformer.reorder_caches` keeps them in step).
    """
    xp = get_array_module(k_new)
    t_new = k_new.shape[2]
    n = cache["k"].shape[2] if "k" in cache else 0
    kbuf = cache.get("kbuf")
    if kbuf is None or n + t_new > kbuf.shape[2]:
        cap = max(2 * n, n + t_new, 16)
        b, h = k_new.shape[:2]
        new_k = xp.empty((b, h, cap, k_new.shape[3]), dtype=k_new.dtype)
        new_v = xp.empty((b, h, cap, v_new.shape[3]), dtype=v_new.dtype)
        if n:
            new_k[:, :, :n] = cache["k"]
            new_v[:, :, :n] = cache["v"]
        cache["kbuf"], cache["vbuf"] = new_k, new_v
    kbuf, vbuf = cache["kbuf"], cache["vbuf"]
    kbuf[:, :, n: n + t_new] = k_new
    vbuf[:, :, n: n + t_new] = v_new
    cache["k"], cache["v"] = kbuf[:, :, : n + t_new], vbuf[:, :, : n + t_new]
    return cache["k"], cache["v"]


class ScaledDotProductAttention(Module):
    """Eq. 1 over batched heads.

    Shapes: q (B, h, Tq, d_k), k (B, h, Tk, d_k), v (B, h, Tk, d_v),
    mask broadcastable to (B, h, Tq, Tk) -> out (B, h, Tq, d_v).
    Optional dropout on the attention weights (not in the paper; off by default).

    q, k, v may be strided views (heads sliced out of a (B, T, h*d) projection):
    every 2-D matrix of the batch has a unit stride, so each product is a BLAS GEMM
    without a copy. ``out=`` (forward) and ``out=(dq, dk, dv)`` (backward) write the
    results into given arrays, e.g. (B, h, T, d) views of a (B, T, h*d) buffer, which
    saves the head-merge copies. On the host the batch is split over the threads of
    :func:`~numformer.backend.parallel_ranges` (each small GEMM is single-threaded in
    OpenBLAS); scores, masking and softmax are done in place on one buffer.
    """

    def __init__(self, dropout: float = 0.0, rng=None):
        super().__init__()
        self.softmax = Softmax()
        self.dropout = Dropout(dropout, rng)
        self.weights = None  # last attention weights, kept only when record_weights is set
        self.record_weights = False
        self._cache = None

    def forward(self, q, k, v, mask=None, out=None):
        xp = get_array_module(q)
        b, h, tq, _ = q.shape
        tk, dv = k.shape[2], v.shape[3]
        if mask is not None:
            mask = xp.asarray(mask)  # a host mask with device arrays is moved (no-op otherwise)
        scale = 1.0 / math.sqrt(q.shape[-1])
        masked = _masked_positions(mask)
        p = xp.empty((b, h, tq, tk), dtype=q.dtype)
        if out is None:
            out = xp.empty((b, h, tq, dv), dtype=q.dtype)
        drop = self.dropout.active()
        fill = xp.asarray(MASKED_SCORE, dtype=p.dtype)

        def weights(i, j):
            pb = p[i:j]
            xp.matmul(q[i:j], k[i:j].swapaxes(-1, -2), out=pb)
            pb *= scale
            mb = _batch_rows(masked, i, j)
            if mb is not None:  # in place on the fresh scores buffer: no extra (B, h, Tq, Tk) array
                xp.copyto(pb, fill, where=mb)
            softmax_(pb)
            if not drop:
                xp.matmul(pb, v[i:j], out=out[i:j])

        work = p.size + out.size if _threads_pay(tq, tk, q.shape[-1], dv) else 0
        parallel_ranges(weights, b, work, q)
        if self.record_weights:
            self.weights = p
        p_drop = p
        if drop:
            p_drop = self.dropout(p)
            parallel_ranges(lambda i, j: xp.matmul(p_drop[i:j], v[i:j], out=out[i:j]), b, work, q)
        if self.training:
            self._cache = (q, k, v, p_drop, p, masked, scale)
        return out

    def backward(self, dout, out=None):
        """dout (B, h, Tq, d_v) -> (dq, dk, dv) with the shapes of q, k, v (written into ``out`` if given)."""
        xp = get_array_module(dout)
        q, k, v, p_drop, p, masked, scale = self._cache
        self._cache = None
        drop_mask = self.dropout._cache_mask  # None unless forward dropped weights
        self.dropout._cache_mask = None
        if out is None:
            out = (xp.empty(q.shape, dtype=dout.dtype), xp.empty(k.shape, dtype=dout.dtype),
                   xp.empty(v.shape, dtype=dout.dtype))
        dq, dk, dv = out
        ds = xp.empty(p.shape, dtype=dout.dtype)
        zero = xp.asarray(0, dtype=ds.dtype)

        def grads(i, j):
            gb, sb = dout[i:j], ds[i:j]
            xp.matmul(p_drop[i:j].swapaxes(-1, -2), gb, out=dv[i:j])
            xp.matmul(gb, v[i:j].swapaxes(-1, -2), out=sb)        # dL/d(dropped weights)
            if drop_mask is not None:
                sb *= drop_mask[i:j]
            softmax_backward_(sb, p[i:j])                         # dL/dscores, in place
            mb = _batch_rows(masked, i, j)
            if mb is not None:
                xp.copyto(sb, zero, where=mb)
            sb *= scale
            xp.matmul(sb, k[i:j], out=dq[i:j])
            xp.matmul(sb.swapaxes(-1, -2), q[i:j], out=dk[i:j])

        work = ds.size + q.size + k.size + v.size if _threads_pay(p.shape[2], p.shape[3], q.shape[3], v.shape[3]) else 0
        parallel_ranges(grads, q.shape[0], work, dout)
        return dq, dk, dv


class MultiHeadAttention(Module):
    """Multi-head attention with h heads, used three ways (Section 3.2.3).

    * self-attention: ``forward(x, mask=...)``; backward returns dx (B, T, d_model);
    * encoder-decoder attention: ``forward(x, memory, mask)``; queries from x
      (B, Tq, d_model), keys and values from memory (B, Tk, d_model); backward
      returns (dx, dmemory).

    Incremental decoding (eval mode only) passes ``cache``, a dict per layer:
    self-attention appends this step's keys/values to it (``cache["k"]``,
    ``cache["v"]``: (B, h, t, d) views of buffers that grow by doubling, so a step
    writes one position instead of copying the whole prefix); encoder-decoder
    attention projects the memory once and reuses it for every step.

    The projections are the Linear children ``w_q``, ``w_k``, ``w_v``, ``w_o``, but
    projections of the same input run as one GEMM against their weights side by
    side (``x [W_Q | W_K | W_V]`` for self-attention, ``memory [W_K | W_V]`` for
    encoder-decoder attention): the heads are strided views of that product (no
    split copy), the attention output is written straight into the (B, T, h*d_v)
    layout that ``w_o`` takes (no merge copy), and backward writes dq, dk, dv side
    by side so the weight gradients and the input gradient are one GEMM each.
    """

    fresh_output = True  # forward and backward return new arrays (see Residual)

    def __init__(self, d_model: int, heads: int, d_k: int | None = None, d_v: int | None = None,
                 attn_dropout: float = 0.0, rng=None, dropout_rng=None, dtype=DEFAULT_DTYPE,
                 init: str = "xavier"):
        super().__init__()
        if d_k is None:
            if d_model % heads:
                raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
            d_k = d_model // heads
        d_v = d_k if d_v is None else d_v
        rng = rng if rng is not None else np.random.default_rng(0)
        self.d_model, self.heads, self.d_k, self.d_v = d_model, heads, d_k, d_v
        self.w_q = Linear(d_model, heads * d_k, rng=rng, dtype=dtype, init=init, role="qkv")
        self.w_k = Linear(d_model, heads * d_k, rng=rng, dtype=dtype, init=init, role="qkv")
        self.w_v = Linear(d_model, heads * d_v, rng=rng, dtype=dtype, init=init, role="qkv")
        self.attention = ScaledDotProductAttention(attn_dropout, dropout_rng)
        self.w_o = Linear(heads * d_v, d_model, rng=rng, dtype=dtype, init=init, role="out")
        self._cache_proj = None

    def _split(self, x, d):
        """(B, T, h*d) -> (B, h, T, d) (a view)."""
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, d).transpose(0, 2, 1, 3)

    @staticmethod
    def _merge(x):
        """(B, h, T, d) -> (B, T, h*d) (contiguous)."""
        b, h, t, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)

    def _heads(self, y2, b, t, col, d):
        """Columns col..col+h*d of a (B*T, n) projection -> (B, h, T, d) strided view."""
        return y2[:, col: col + self.heads * d].reshape(b, t, self.heads, d).transpose(0, 2, 1, 3)

    @staticmethod
    def _joined(linears):
        """(weight (d_in, sum d_out), bias or None) of Linear layers applied to one input."""
        if len(linears) == 1:
            lin = linears[0]
            return lin.weight.data, None if lin.bias is None else lin.bias.data
        xp = get_array_module(linears[0].weight.data)
        w = xp.concatenate([lin.weight.data for lin in linears], axis=1)
        if any(lin.bias is None for lin in linears):
            return w, None if all(lin.bias is None for lin in linears) else xp.concatenate(
                [lin.bias.data if lin.bias is not None else xp.zeros(lin.d_out, dtype=w.dtype) for lin in linears])
        return w, xp.concatenate([lin.bias.data for lin in linears])

    def _project(self, x, linears):
        """x (B, T, d_model) -> (x2d, joined weight, (B*T, sum d_out)): one GEMM for several projections."""
        w, bias = self._joined(linears)
        x2 = x.reshape(-1, self.d_model)
        y = matmul(x2, w)  # plain @ unless a lower precision is set (numformer.precision)
        if bias is not None:
            add_bias_(y, bias)
        return x2, w, y

    @staticmethod
    def _project_backward(x2, w, dy2, linears):
        """Adds x^T dy and sum(dy) into each Linear's gradients; returns dy W^T (B*T, d_model)."""
        xp = get_array_module(dy2)
        gw = matmul(x2.T, dy2)
        gb = xp.ones(dy2.shape[0], dtype=dy2.dtype) @ dy2  # column sums as a GEMV
        col = 0
        for lin in linears:
            lin.weight.grad += gw[:, col: col + lin.d_out]
            if lin.bias is not None:
                lin.bias.grad += gb[col: col + lin.d_out]
            col += lin.d_out
        return matmul(dy2, w.T)

    def forward(self, x, memory=None, mask=None, cache=None):
        """x (B, Tq, d_model), memory (B, Tk, d_model) or None -> (B, Tq, d_model)."""
        xp = get_array_module(x)
        cross = memory is not None
        b, tq, _ = x.shape
        h, dk, dv = self.heads, self.d_k, self.d_v
        if mask is not None:
            mask = xp.asarray(mask)
        proj = None
        if cache is None:
            if cross:
                tk = memory.shape[1]
                xq, wq, q2 = self._project(x, (self.w_q,))
                xkv, wkv, kv2 = self._project(memory, (self.w_k, self.w_v))
                q = self._heads(q2, b, tq, 0, dk)
                k, v = self._heads(kv2, b, tk, 0, dk), self._heads(kv2, b, tk, h * dk, dv)
                proj = (xq, wq, xkv, wkv, tk)
            else:
                xqkv, wqkv, qkv2 = self._project(x, (self.w_q, self.w_k, self.w_v))
                q = self._heads(qkv2, b, tq, 0, dk)
                k, v = self._heads(qkv2, b, tq, h * dk, dk), self._heads(qkv2, b, tq, 2 * h * dk, dv)
                proj = (xqkv, wqkv)
        elif cross:
            q = self._heads(self._project(x, (self.w_q,))[2], b, tq, 0, dk)
            if "k" not in cache:
                tk = memory.shape[1]
                kv2 = self._project(memory, (self.w_k, self.w_v))[2]
                cache["k"] = self._heads(kv2, b, tk, 0, dk)
                cache["v"] = self._heads(kv2, b, tk, h * dk, dv)
            k, v = cache["k"], cache["v"]
        else:
            qkv2 = self._project(x, (self.w_q, self.w_k, self.w_v))[2]
            q = self._heads(qkv2, b, tq, 0, dk)
            k_new, v_new = self._heads(qkv2, b, tq, h * dk, dk), self._heads(qkv2, b, tq, 2 * h * dk, dv)
            k, v = _cache_append(cache, k_new, v_new)
        merged = xp.empty((b, tq, h * dv), dtype=q.dtype)
        self.attention(q, k, v, mask, out=self._split(merged, dv))
        if self.training:
            self._cache_proj = proj
        return self.w_o(merged)

    def backward(self, dy):
        """dy (B, Tq, d_model) -> dx (self-attention) or (dx, dmemory) (encoder-decoder)."""
        xp = get_array_module(dy)
        proj = self._cache_proj
        self._cache_proj = None
        h, dk, dv = self.heads, self.d_k, self.d_v
        d_heads = self._split(self.w_o.backward(dy), dv)
        b, _, tq, _ = d_heads.shape
        if len(proj) == 2:  # self-attention: dq, dk, dv side by side, one GEMM back
            xqkv, wqkv = proj
            g = xp.empty((b * tq, h * (2 * dk + dv)), dtype=dy.dtype)
            self.attention.backward(d_heads, out=(self._heads(g, b, tq, 0, dk), self._heads(g, b, tq, h * dk, dk),
                                                  self._heads(g, b, tq, 2 * h * dk, dv)))
            dx = self._project_backward(xqkv, wqkv, g, (self.w_q, self.w_k, self.w_v))
            return dx.reshape(dy.shape)
        xq, wq, xkv, wkv, tk = proj
        gq = xp.empty((b * tq, h * dk), dtype=dy.dtype)
        gkv = xp.empty((b * tk, h * (dk + dv)), dtype=dy.dtype)
        self.attention.backward(d_heads, out=(self._heads(gq, b, tq, 0, dk), self._heads(gkv, b, tk, 0, dk),
                                              self._heads(gkv, b, tk, h * dk, dv)))
        dx = self._project_backward(xq, wq, gq, (self.w_q,))
        dmemory = self._project_backward(xkv, wkv, gkv, (self.w_k, self.w_v))
        return dx.reshape(dy.shape), dmemory.reshape(b, tk, self.d_model)
