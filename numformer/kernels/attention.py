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

With attention dropout (not in the paper, off by default) host arrays go to the plain math.

**On a GPU** (cupy arrays; issue 60, item 2) the GEMMs are :func:`numformer.backend.product`'s (CuPy's ``@``, or inside
a captured training step numformer's own cuBLAS handle: numformer/kernels/gemm.py) and what lies between them is one CUDA
kernel each way (:data:`ATTENTION_CUDA`), where the plain math launches half a dozen passes over the
(B, h, Tq, Tk) scores:

* ``attention_softmax_forward[_masked]_{float32,float64}``: per row of the scores, in place,
  ``S = S * scale``, masked scores replaced by ``MASKED_SCORE`` (a fully masked row then is uniform, finite, as
  the plain math makes it), ``P = exp(S - max S) / sum exp(S - max S)``;
* ``attention_softmax_backward[_masked]_{float32,float64}``: per row, in place on dP,
  ``dS = P * (dP - rowsum(dP * P))``, masked entries 0, times ``scale``.

One block per row (grid-stride over the B * h * Tq rows, at most ``MAX_ROW_BLOCKS`` blocks), 32 to 128 threads
(``SOFTMAX_THREADS``, the power of two that covers Tk), the max and the sums as tree reductions in shared memory.
Every element's operations are the plain math's, one rounding each (``--fmad=false``); only the order of the
row sums differs (a tree, not cupy's reduction), so the results agree to a few ulps, not bit for bit. The mask
is read through broadcast strides (any mask broadcastable to (B, h, Tq, Tk): padding (B, 1, 1, Tk), causal and
padding (B, 1, Tq, Tk)). Attention dropout stays the dropout layer's: the twin calls it on P between the kernel
and the second GEMM (and its backward on dP before the backward kernel), so the layer keeps its mask for its
backward and its taps; with the dropout kernel (numformer/kernels/dropout.py) that is one more launch each way.
The kernels run once a GPU run has proven them (``cuda_proofs.json``) or with ``NUMFORMER_CUDA_UNPROVEN=1``;
otherwise, and for arguments they do not take, the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import MASKED_SCORE, get_array_module, is_cupy_array, product
from .cuda_sources import cuda_source, kernel_function, may_run
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


# -- the GPU: the softmax between the two GEMMs, forward and backward, as one CUDA kernel each ----------------
ATTENTION_CUDA = cuda_source("attention", r"""
#define NF_SOFTMAX_THREADS 128

// -infinity (NVRTC has no INFINITY without headers): the bits of IEEE's
template <typename T> __device__ __forceinline__ T nf_minus_infinity();
template <> __device__ __forceinline__ float nf_minus_infinity<float>() { return __uint_as_float(0xff800000u); }
template <> __device__ __forceinline__ double nf_minus_infinity<double>() {
    return __longlong_as_double((long long)0xfff0000000000000ULL);
}

// max that keeps a NaN, as numpy's and cupy's max do
template <typename T>
__device__ __forceinline__ T nf_max(T a, T b) { return (a > b || a != a) ? a : b; }

// The block's max and sum of one value per thread (blockDim.x a power of two, at most NF_SOFTMAX_THREADS).
template <typename T>
__device__ T nf_block_max(T v, T* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = nf_max(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    T r = red[0];
    __syncthreads();
    return r;
}

template <typename T>
__device__ T nf_block_sum(T v, T* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = red[threadIdx.x] + red[threadIdx.x + s];
        __syncthreads();
    }
    T r = red[0];
    __syncthreads();
    return r;
}

// Row r of the (B, h, Tq, Tk) scores: its mask row, through the mask's broadcast strides (elements; 0: broadcast).
__device__ __forceinline__ const bool* nf_mask_row(const bool* masked, long long r, long long heads, long long tq,
                                                   long long sb, long long sh, long long sq) {
    return masked + (r / (heads * tq)) * sb + ((r / tq) % heads) * sh + (r % tq) * sq;
}

// P = softmax(where(masked, fill, S * scale)) per row, in place on S.
template <typename T, bool MASKED>
__device__ void softmax_forward_rows(T* s, const bool* masked, long long rows, long long tk, long long heads,
                                     long long tq, long long sb, long long sh, long long sq, long long sk, T scale,
                                     T fill, T* red) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        T* row = s + r * tk;
        const bool* mrow = MASKED ? nf_mask_row(masked, r, heads, tq, sb, sh, sq) : masked;
        T local = nf_minus_infinity<T>();
        for (long long j = threadIdx.x; j < tk; j += blockDim.x) {
            T v = row[j] * scale;
            if (MASKED && mrow[j * sk]) v = fill;
            row[j] = v;
            local = nf_max(local, v);
        }
        T top = nf_block_max(local, red);
        T part = 0;
        for (long long j = threadIdx.x; j < tk; j += blockDim.x) {
            T e = exp(row[j] - top);
            row[j] = e;
            part = part + e;
        }
        T total = nf_block_sum(part, red);
        for (long long j = threadIdx.x; j < tk; j += blockDim.x) row[j] = row[j] / total;
    }
}

// dS = where(masked, 0, P * (dP - rowsum(dP * P))) * scale per row, in place on dP.
template <typename T, bool MASKED>
__device__ void softmax_backward_rows(T* dp, const T* p, const bool* masked, long long rows, long long tk,
                                      long long heads, long long tq, long long sb, long long sh, long long sq,
                                      long long sk, T scale, T* red) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        T* drow = dp + r * tk;
        const T* prow = p + r * tk;
        const bool* mrow = MASKED ? nf_mask_row(masked, r, heads, tq, sb, sh, sq) : masked;
        T part = 0;
        for (long long j = threadIdx.x; j < tk; j += blockDim.x) part = part + drow[j] * prow[j];
        T total = nf_block_sum(part, red);
        for (long long j = threadIdx.x; j < tk; j += blockDim.x) {
            T v = prow[j] * (drow[j] - total);
            if (MASKED && mrow[j * sk]) v = 0;
            drow[j] = v * scale;
        }
    }
}

#define ATTENTION_KERNELS(SUFFIX, T)                                                                           \
extern "C" __global__ void attention_softmax_forward_##SUFFIX(T* s, long long rows, long long tk, T scale) {  \
    __shared__ T red[NF_SOFTMAX_THREADS];                                                                      \
    softmax_forward_rows<T, false>(s, (const bool*)0, rows, tk, 1, 1, 0, 0, 0, 0, scale, (T)0, red);            \
}                                                                                                              \
extern "C" __global__ void attention_softmax_forward_masked_##SUFFIX(                                          \
        T* s, const bool* masked, long long rows, long long tk, long long heads, long long tq, long long sb,   \
        long long sh, long long sq, long long sk, T scale, T fill) {                                           \
    __shared__ T red[NF_SOFTMAX_THREADS];                                                                      \
    softmax_forward_rows<T, true>(s, masked, rows, tk, heads, tq, sb, sh, sq, sk, scale, fill, red);           \
}                                                                                                              \
extern "C" __global__ void attention_softmax_backward_##SUFFIX(T* dp, const T* p, long long rows, long long tk, \
                                                               T scale) {                                      \
    __shared__ T red[NF_SOFTMAX_THREADS];                                                                      \
    softmax_backward_rows<T, false>(dp, p, (const bool*)0, rows, tk, 1, 1, 0, 0, 0, 0, scale, red);             \
}                                                                                                              \
extern "C" __global__ void attention_softmax_backward_masked_##SUFFIX(                                         \
        T* dp, const T* p, const bool* masked, long long rows, long long tk, long long heads, long long tq,     \
        long long sb, long long sh, long long sq, long long sk, T scale) {                                     \
    __shared__ T red[NF_SOFTMAX_THREADS];                                                                      \
    softmax_backward_rows<T, true>(dp, p, masked, rows, tk, heads, tq, sb, sh, sq, sk, scale, red);            \
}

ATTENTION_KERNELS(float32, float)
ATTENTION_KERNELS(float64, double)
""")
SOFTMAX_THREADS = 128        # the most threads a row's block gets (NF_SOFTMAX_THREADS in the source)
MAX_ROW_BLOCKS = 1 << 16     # blocks of a launch; more rows run in a grid-stride loop
CUDA_DTYPES = ("float32", "float64")


def _row_threads(tk: int) -> int:
    """Threads per row: the power of two from 32 (a warp) to SOFTMAX_THREADS that covers Tk."""
    threads = 32
    while threads < tk and threads < SOFTMAX_THREADS:
        threads *= 2
    return threads


def _broadcasts_to(masked, shape) -> bool:
    """Whether a bool mask broadcasts to ``shape`` (B, h, Tq, Tk) by size-1 dimensions only."""
    if masked.dtype != np.bool_ or masked.ndim > 4:
        return False
    dims = (1,) * (4 - masked.ndim) + tuple(masked.shape)
    return all(d in (1, n) for d, n in zip(dims, shape))


def _fits(q, k, v, masked) -> bool:
    """What the CUDA kernels take: (B, h, T, d) float32/float64 arrays of one dtype and batch shape, Tk >= 1, and a
    mask (or none) that broadcasts to (B, h, Tq, Tk)."""
    if not (q.ndim == k.ndim == v.ndim == 4 and q.dtype.name in CUDA_DTYPES and q.dtype == k.dtype == v.dtype):
        return False
    if not (q.shape[:2] == k.shape[:2] == v.shape[:2] and k.shape[2] == v.shape[2] >= 1 and q.shape[3] == k.shape[3]):
        return False
    return masked is None or _broadcasts_to(masked, (*q.shape[:3], k.shape[2]))


def _mask_arguments(masked, shape) -> tuple:
    """(the mask as a contiguous bool array, np.int64 strides of B, h, Tq and Tk in elements: 0 where broadcast)."""
    xp = get_array_module(masked)
    m = masked if masked.flags.c_contiguous else xp.ascontiguousarray(masked)
    dims = (1,) * (4 - m.ndim) + tuple(m.shape)
    strides, step = [0, 0, 0, 0], 1
    for axis in (3, 2, 1, 0):
        strides[axis] = 0 if dims[axis] == 1 else step
        step *= dims[axis]
    return m, tuple(np.int64(x) for x in strides)


def _row_launch(shape, dtype) -> tuple:
    """(grid, block, rows, tk) of a softmax kernel over scores of ``shape`` (B, h, Tq, Tk)."""
    b, h, tq, tk = shape
    rows = b * h * tq
    return (min(rows, MAX_ROW_BLOCKS) or 1,), (_row_threads(tk),), rows, tk


def attention_softmax_cuda(s, masked, scale: float):
    """In place on the (B, h, Tq, Tk) scores ``s`` (contiguous): ``P = softmax(where(masked, MASKED_SCORE,
    S * scale))``, one launch. Returns ``s``."""
    grid, block, rows, tk = _row_launch(s.shape, s.dtype)
    t = s.dtype.type
    if masked is None:
        kernel_function("attention", f"attention_softmax_forward_{s.dtype.name}")(
            grid, block, (s, np.int64(rows), np.int64(tk), t(scale)))
    else:
        m, (sb, sh, sq, sk) = _mask_arguments(masked, s.shape)
        kernel_function("attention", f"attention_softmax_forward_masked_{s.dtype.name}")(
            grid, block, (s, m, np.int64(rows), np.int64(tk), np.int64(s.shape[1]), np.int64(s.shape[2]),
                          sb, sh, sq, sk, t(scale), t(MASKED_SCORE)))
    return s


def attention_softmax_backward_cuda(dp, p, masked, scale: float):
    """In place on dP (B, h, Tq, Tk), contiguous like P: ``dS = where(masked, 0, P * (dP - rowsum(dP * P))) *
    scale``, one launch. Returns the buffer, now dS."""
    grid, block, rows, tk = _row_launch(dp.shape, dp.dtype)
    t = dp.dtype.type
    if masked is None:
        kernel_function("attention", f"attention_softmax_backward_{dp.dtype.name}")(
            grid, block, (dp, p, np.int64(rows), np.int64(tk), t(scale)))
    else:
        m, (sb, sh, sq, sk) = _mask_arguments(masked, dp.shape)
        kernel_function("attention", f"attention_softmax_backward_masked_{dp.dtype.name}")(
            grid, block, (dp, p, m, np.int64(rows), np.int64(tk), np.int64(dp.shape[1]), np.int64(dp.shape[2]),
                          sb, sh, sq, sk, t(scale)))
    return dp


def _contiguous(a):
    return a if a.flags.c_contiguous else get_array_module(a).ascontiguousarray(a)


def attention_forward_cuda(q, k, v, masked, scale: float, dropout=None):
    """:func:`numformer.layers.attention.attention_forward` on cupy arrays (numpy under the host emulator): the
    two GEMMs as the plain math's, the scale, mask and softmax between them in one kernel, ``dropout`` (the
    layer) on P as the plain math calls it."""
    p = attention_softmax_cuda(_contiguous(product(q, k.swapaxes(-1, -2))), masked, scale)
    p_used = p if dropout is None else dropout(p)
    return product(p_used, v), p, p_used


def attention_backward_cuda(dout, q, k, v, p, p_used, masked, scale: float, dropout_backward=None):
    """:func:`numformer.layers.attention.attention_backward` on cupy arrays (numpy under the host emulator): the
    GEMMs as the plain math's, ``dropout_backward`` on dP as the plain math calls it, the softmax backward, mask
    and scale in one kernel."""
    dv = product(p_used.swapaxes(-1, -2), dout)
    dp = product(dout, v.swapaxes(-1, -2))
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    ds = attention_softmax_backward_cuda(_contiguous(dp), _contiguous(p), masked, scale)
    return product(ds, k), product(ds.swapaxes(-1, -2), q), dv


def _forward_runs_here(q, k, v, masked, scale, dropout=None) -> bool:
    """Host arrays without dropout (the host kernel); cupy arrays when the CUDA kernels may run (proven, or opted
    in) and the arguments fit (dropout or not); else the plain math."""
    if not is_cupy_array(q):
        return dropout is None
    return may_run("attention") and _fits(q, k, v, masked)


def _backward_runs_here(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None) -> bool:
    if not is_cupy_array(dout):
        return dropout_backward is None
    return may_run("attention") and _fits(q, k, v, masked) and p.shape == (*q.shape[:3], k.shape[2])


@replaces("numformer.layers.attention.attention_forward", when=_forward_runs_here)
def attention_forward_fast(q, k, v, masked, scale: float, dropout=None):
    if is_cupy_array(q):
        return attention_forward_cuda(q, k, v, masked, scale, dropout)
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


@replaces("numformer.layers.attention.attention_backward", when=_backward_runs_here)
def attention_backward_fast(dout, q, k, v, p, p_used, masked, scale: float, dropout_backward=None):
    if is_cupy_array(dout):
        return attention_backward_cuda(dout, q, k, v, p, p_used, masked, scale, dropout_backward)
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
