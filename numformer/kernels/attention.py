"""Fast scaled dot-product attention (Eq. 1), forward and backward, on the host.

Same inputs and outputs as :func:`numformer.layers.attention.attention_forward` and
:func:`~numformer.layers.attention.attention_backward`. What is different:

* the batch is split over the host threads (:func:`~.threads.parallel_ranges`): each
  head's GEMM is small enough that OpenBLAS runs it on the calling thread alone, so
  without this the second core idles during attention;
* scores, mask, softmax and the weighted sum run block by block on one (B, h, Tq, Tk)
  buffer, in place: no second scores-sized temporary;
* the mask pass is skipped when nothing is masked;
* outputs are written into the layout the next GEMM reads: O into a (B, Tq, h, d_v)
  buffer (so ``MultiHeadAttention._merge`` is a free reshape), dQ, dK, dV into
  (B, T, h, d) buffers likewise. They are returned as (B, h, T, d) views, the shapes
  of the plain outputs.

Attention dropout (not in the paper, off by default) and cupy arrays go to the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import MASKED_SCORE, is_cupy_array
from .twins import replaces
from .host.threads import parallel_ranges

BLAS_SMALL_GEMM = 1 << 18  # m*n*k up to which OpenBLAS runs a GEMM on the calling thread only


def _threads_pay(tq: int, tk: int, dk: int, dv: int) -> bool:
    """Split the batch over host threads only when every per-head GEMM is small enough that
    OpenBLAS would run it single-threaded anyway (bigger ones it threads itself)."""
    return tq * tk * max(dk, dv) <= BLAS_SMALL_GEMM


def _batch_rows(a, i: int, j: int):
    """Batch rows i:j of a (B, ...) array, or the array itself where it is broadcast over the batch."""
    if a is None or a.ndim < 4 or a.shape[0] == 1:
        return a
    return a[i:j]


def _heads_layout(b: int, h: int, t: int, d: int, dtype):
    """A new (B, T, h, d) buffer seen as (B, h, T, d): what a head-merge reads without a copy."""
    return np.empty((b, t, h, d), dtype=dtype).transpose(0, 2, 1, 3)


@replaces("numformer.layers.attention.attention_forward",
          when=lambda q, k, v, masked, scale, dropout=None: dropout is None and not is_cupy_array(q))
def attention_forward_fast(q, k, v, masked, scale: float, dropout=None):
    b, h, tq, dk = q.shape
    tk, dv = k.shape[2], v.shape[3]
    if masked is not None and not masked.any():
        masked = None
    p = np.empty((b, h, tq, tk), dtype=q.dtype)
    out = _heads_layout(b, h, tq, dv, q.dtype)
    fill = np.asarray(MASKED_SCORE, dtype=p.dtype)

    def rows(i, j):
        pb = p[i:j]
        np.matmul(q[i:j], k[i:j].swapaxes(-1, -2), out=pb)
        pb *= scale
        mb = _batch_rows(masked, i, j)
        if mb is not None:
            np.copyto(pb, fill, where=mb)
        pb -= pb.max(axis=-1, keepdims=True)
        np.exp(pb, out=pb)
        pb /= pb.sum(axis=-1, keepdims=True)
        np.matmul(pb, v[i:j], out=out[i:j])

    parallel_ranges(rows, b, p.size + out.size if _threads_pay(tq, tk, dk, dv) else 0, q)
    return out, p, p


@replaces("numformer.layers.attention.attention_backward",
          when=lambda dout, q, k, v, p, p_used, masked, scale, dropout_backward=None: (dropout_backward is None
                                                                                 and not is_cupy_array(dout)))
def attention_backward_fast(dout, q, k, v, p, p_used, masked, scale: float, dropout_backward=None):
    b, h, tq, dk = q.shape
    tk, dv_ = k.shape[2], v.shape[3]
    if masked is not None and not masked.any():
        masked = None
    dq = _heads_layout(b, h, tq, dk, dout.dtype)
    dk_ = _heads_layout(b, h, tk, dk, dout.dtype)
    dv = _heads_layout(b, h, tk, dv_, dout.dtype)
    ds = np.empty(p.shape, dtype=dout.dtype)
    zero = np.asarray(0, dtype=ds.dtype)

    def rows(i, j):
        gb, sb, pb = dout[i:j], ds[i:j], p[i:j]
        np.matmul(pb.swapaxes(-1, -2), gb, out=dv[i:j])
        np.matmul(gb, v[i:j].swapaxes(-1, -2), out=sb)          # dP
        t = (sb * pb).sum(axis=-1, keepdims=True)
        sb -= t
        sb *= pb                                                # dS = P * (dP - rowsum(dP * P))
        mb = _batch_rows(masked, i, j)
        if mb is not None:
            np.copyto(sb, zero, where=mb)
        sb *= scale
        np.matmul(sb, k[i:j], out=dq[i:j])
        np.matmul(sb.swapaxes(-1, -2), q[i:j], out=dk_[i:j])

    work = ds.size + q.size + k.size + v.size if _threads_pay(tq, tk, dk, dv_) else 0
    parallel_ranges(rows, b, work, dout)
    return dq, dk_, dv
