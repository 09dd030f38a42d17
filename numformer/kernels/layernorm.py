"""Fast LayerNorm forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.layernorm.layernorm_forward` / ``layernorm_backward``.

Row blocks of about ``LN_BLOCK`` elements (cache-resident across the several passes),
spread over the host threads; row means as GEMVs with a ``1/d`` vector (about 3x faster
than ``.mean(axis=-1)`` here); three buffers reused inside each block instead of a new
temporary per operation; the column sums of backward as GEMVs with a ones vector, one
partial per block, summed at the end.

On a GPU (issue 60, item 2): one CUDA kernel a direction (:data:`LAYERNORM_CUDA`, kernel ``layernorm``), where
the plain math's unfused passes cost 1.7 ms a backward call on an H200 (docs/gpu.md). One block of 256 threads
takes one row at a time (a grid-stride loop over the rows); the row's sums are a tree in shared memory; the
column sums of backward (dgamma, dbeta) are partials per block (in registers, written once), added by the
``column_sums`` kernel shared with the bias gradient (numformer/kernels/linear.py): no atomics, deterministic.
Each element is computed in the plain math's order, one rounding per operation (compiled without multiply-add
contraction); only the sums' order of additions differs from numpy's and cupy's. It runs only once a GPU run
has proven it (``cuda_proofs.json``) or with ``NUMFORMER_CUDA_UNPROVEN=1``; otherwise the switch runs the
plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, is_cupy_array
from . import cuda_sources
from .cuda_sources import cuda_source
from .host.threads import parallel_rows
from .linear import COLUMN_SUMS_CUDA, column_sums_of_partials_cuda
from .twins import replaces

LN_BLOCK = 1 << 16  # elements per row block

# numformer/layers/layernorm.py, per row of d, in its order of operations (T: the row's dtype, every sum in T):
#   forward:  mu = sum(x) / d; var = sum((x - mu) * (x - mu)) / d; r = 1 / sqrt(var + eps);
#             xhat = (x - mu) * r; y = xhat * gamma + beta
#   backward: dxhat = dy * gamma; m1 = sum(dxhat) / d; m2 = sum(dxhat * xhat) / d;
#             dx = r * ((dxhat - m1) - xhat * m2); dgamma += dy * xhat, dbeta += dy over the block's rows
# A thread adds its columns (threadIdx.x, + 256, + 512, ...) in order, then the block adds the 256 threads'
# sums as a tree in shared memory. Backward keeps its columns' dgamma/dbeta partials in registers (at most
# LN_MAX_PER_THREAD columns a thread: d <= 2048) and writes them once, to row blockIdx.x of the (blocks, 2d)
# partials (dgamma's, then dbeta's); ``column_sums`` adds the blocks' partials of both in one launch.
LAYERNORM_CUDA = cuda_source("layernorm", COLUMN_SUMS_CUDA + r"""
#define LN_THREADS 256
#define LN_MAX_PER_THREAD 8

template <typename T>
__device__ void ln_block_sum2(T* a, T* b, T* sh_a, T* sh_b) {
    const int t = threadIdx.x;
    sh_a[t] = *a;
    sh_b[t] = *b;
    __syncthreads();
    for (int s = LN_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            sh_a[t] = sh_a[t] + sh_a[t + s];
            sh_b[t] = sh_b[t] + sh_b[t + s];
        }
        __syncthreads();
    }
    *a = sh_a[0];
    *b = sh_b[0];
    __syncthreads();
}

template <typename T>
__device__ void ln_forward_rows(const T* x, const T* gamma, const T* beta, T* y, T* xhat, T* r, long long n,
                                long long d, T eps, T* sh_a, T* sh_b) {
    const T dd = (T)d;
    for (long long row = blockIdx.x; row < n; row += gridDim.x) {
        const T* xr = x + row * d;
        T s = 0, unused = 0;
        for (long long c = threadIdx.x; c < d; c += LN_THREADS) s = s + xr[c];
        ln_block_sum2<T>(&s, &unused, sh_a, sh_b);
        const T mu = s / dd;
        T q = 0;
        for (long long c = threadIdx.x; c < d; c += LN_THREADS) {
            const T e = xr[c] - mu;
            q = q + e * e;
        }
        ln_block_sum2<T>(&q, &unused, sh_a, sh_b);
        const T var = q / dd;
        const T rr = (T)1 / sqrt(var + eps);
        for (long long c = threadIdx.x; c < d; c += LN_THREADS) {
            const T h = (xr[c] - mu) * rr;
            xhat[row * d + c] = h;
            y[row * d + c] = h * gamma[c] + beta[c];
        }
        if (threadIdx.x == 0) r[row] = rr;
    }
}

template <typename T>
__device__ void ln_backward_rows(const T* dy, const T* xhat, const T* r, const T* gamma, T* dx, T* part,
                                 long long n, long long d, T* sh_a, T* sh_b) {
    const T dd = (T)d;
    T acc_g[LN_MAX_PER_THREAD], acc_b[LN_MAX_PER_THREAD];
#pragma unroll
    for (int k = 0; k < LN_MAX_PER_THREAD; ++k) {
        acc_g[k] = 0;
        acc_b[k] = 0;
    }
    for (long long row = blockIdx.x; row < n; row += gridDim.x) {
        const T* dyr = dy + row * d;
        const T* hr = xhat + row * d;
        T s1 = 0, s2 = 0;
#pragma unroll
        for (int k = 0; k < LN_MAX_PER_THREAD; ++k) {
            const long long c = threadIdx.x + (long long)k * LN_THREADS;
            if (c < d) {
                const T g = dyr[c], h = hr[c];
                acc_g[k] = acc_g[k] + g * h;
                acc_b[k] = acc_b[k] + g;
                const T dh = g * gamma[c];
                s1 = s1 + dh;
                s2 = s2 + dh * h;
            }
        }
        ln_block_sum2<T>(&s1, &s2, sh_a, sh_b);
        const T m1 = s1 / dd, m2 = s2 / dd;
        const T rr = r[row];
#pragma unroll
        for (int k = 0; k < LN_MAX_PER_THREAD; ++k) {
            const long long c = threadIdx.x + (long long)k * LN_THREADS;
            if (c < d) {
                const T h = hr[c];
                const T dh = dyr[c] * gamma[c];
                dx[row * d + c] = rr * ((dh - m1) - h * m2);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < LN_MAX_PER_THREAD; ++k) {
        const long long c = threadIdx.x + (long long)k * LN_THREADS;
        if (c < d) {
            part[(long long)blockIdx.x * 2 * d + c] = acc_g[k];
            part[(long long)blockIdx.x * 2 * d + d + c] = acc_b[k];
        }
    }
}

#define LAYERNORM_KERNELS(SUFFIX, T)                                                                          \
extern "C" __global__ void layernorm_forward_##SUFFIX(const T* x, const T* gamma, const T* beta, T* y,       \
                                                      T* xhat, T* r, long long n, long long d, T eps) {      \
    __shared__ T sh_a[LN_THREADS];                                                                            \
    __shared__ T sh_b[LN_THREADS];                                                                            \
    ln_forward_rows<T>(x, gamma, beta, y, xhat, r, n, d, eps, sh_a, sh_b);                                    \
}                                                                                                             \
extern "C" __global__ void layernorm_backward_##SUFFIX(const T* dy, const T* xhat, const T* r,               \
                                                       const T* gamma, T* dx, T* part,                        \
                                                       long long n, long long d) {                            \
    __shared__ T sh_a[LN_THREADS];                                                                            \
    __shared__ T sh_b[LN_THREADS];                                                                            \
    ln_backward_rows<T>(dy, xhat, r, gamma, dx, part, n, d, sh_a, sh_b);                                      \
}

LAYERNORM_KERNELS(float32, float)
LAYERNORM_KERNELS(float64, double)
""")
LN_THREADS, LN_MAX_PER_THREAD = 256, 8
LN_MAX_D = LN_THREADS * LN_MAX_PER_THREAD  # backward's widest row (its column partials live in registers)
LN_FORWARD_BLOCKS = 1 << 16  # a grid-stride loop over the rows
LN_BACKWARD_BLOCKS = 1024  # also the number of dgamma/dbeta partials a column (scratch: 1024 x 2d)
_FLOATS = ("float32", "float64")


def _fit(arrays, d: int, n: int) -> bool:
    """Arrays of one float dtype, every one C-contiguous; at least one row and one column."""
    dtype = arrays[0].dtype
    return (dtype.name in _FLOATS and n >= 1 and d >= 1
            and all(a.dtype == dtype and a.flags.c_contiguous for a in arrays))


def layernorm_forward_fits(x, gamma, beta) -> bool:
    """Whether :func:`layernorm_forward_cuda` takes these: x (n, d), gamma and beta (d,), one dtype, contiguous."""
    return (x.ndim == 2 and gamma.shape == (x.shape[1],) and beta.shape == (x.shape[1],)
            and _fit([x, gamma, beta], x.shape[1], x.shape[0]))


def layernorm_backward_fits(dy, xhat, r, gamma) -> bool:
    """Whether :func:`layernorm_backward_cuda` takes these: dy and xhat (n, d <= LN_MAX_D), r (n, 1), gamma (d,)."""
    if dy.ndim != 2:
        return False
    n, d = dy.shape
    return (xhat.shape == (n, d) and r.shape == (n, 1) and gamma.shape == (d,) and d <= LN_MAX_D
            and _fit([dy, xhat, r, gamma], d, n))


def layernorm_forward_cuda(x, gamma, beta, eps: float):
    """:func:`numformer.layers.layernorm.layernorm_forward` by :data:`LAYERNORM_CUDA` (one launch). Takes cupy
    arrays (numpy arrays under the host emulator's ``emulated()``)."""
    xp = get_array_module(x)
    n, d = x.shape
    y, xhat = xp.empty_like(x), xp.empty_like(x)
    r = xp.empty((n, 1), dtype=x.dtype)
    function = cuda_sources.kernel_function("layernorm", f"layernorm_forward_{x.dtype.name}")
    function((min(n, LN_FORWARD_BLOCKS),), (LN_THREADS,),
             (x, gamma, beta, y, xhat, r, np.int64(n), np.int64(d), x.dtype.type(eps)))
    return y, xhat, r


def layernorm_backward_cuda(dy, xhat, r, gamma):
    """:func:`numformer.layers.layernorm.layernorm_backward` by :data:`LAYERNORM_CUDA` (two launches: the rows
    with their dgamma and dbeta partials per block, then the partials' column sums, both in one)."""
    xp = get_array_module(dy)
    n, d = dy.shape
    blocks = min(n, LN_BACKWARD_BLOCKS)
    dx = xp.empty_like(dy)
    partials = xp.empty((blocks, 2 * d), dtype=dy.dtype)  # a row per block: its dgamma partials, its dbeta's
    function = cuda_sources.kernel_function("layernorm", f"layernorm_backward_{dy.dtype.name}")
    function((blocks,), (LN_THREADS,), (dy, xhat, r, gamma, dx, partials, np.int64(n), np.int64(d)))
    sums = column_sums_of_partials_cuda("layernorm", partials)
    return dx, sums[:d], sums[d:]


def _forward_runs_here(x, gamma, beta, eps) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and they fit."""
    if not is_cupy_array(x):
        return True
    return cuda_sources.may_run("layernorm") and layernorm_forward_fits(x, gamma, beta)


def _backward_runs_here(dy, xhat, r, gamma) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and they fit."""
    if not is_cupy_array(dy):
        return True
    return cuda_sources.may_run("layernorm") and layernorm_backward_fits(dy, xhat, r, gamma)


@replaces("numformer.layers.layernorm.layernorm_forward", when=_forward_runs_here)
def layernorm_forward_fast(x, gamma, beta, eps: float):
    if is_cupy_array(x):
        return layernorm_forward_cuda(x, gamma, beta, eps)
    n, d = x.shape
    xhat, y = np.empty_like(x), np.empty_like(x)
    r = np.empty((n, 1), dtype=x.dtype)
    inv_d = np.full(d, 1.0 / d, dtype=x.dtype)

    def block(xb, hb, yb, rb):
        mean = (xb @ inv_d)[:, None]
        np.subtract(xb, mean, out=hb)
        np.multiply(hb, hb, out=yb)                   # yb: scratch for the squares
        var = (yb @ inv_d)[:, None]
        var += eps
        np.sqrt(var, out=var)
        np.divide(1.0, var, out=rb)
        hb *= rb
        np.multiply(hb, gamma, out=yb)
        yb += beta

    parallel_rows(block, x, xhat, y, r, chunk_elements=LN_BLOCK)
    return y, xhat, r


@replaces("numformer.layers.layernorm.layernorm_backward", when=_backward_runs_here)
def layernorm_backward_fast(dy, xhat, r, gamma):
    if is_cupy_array(dy):
        return layernorm_backward_cuda(dy, xhat, r, gamma)
    d = dy.shape[1]
    dx = np.empty_like(dy)
    inv_d = np.full(d, 1.0 / d, dtype=dy.dtype)

    def block(dyb, hb, rb, dxb):
        ones = np.ones(dyb.shape[0], dtype=dyb.dtype)
        np.multiply(dyb, hb, out=dxb)                 # dxb: scratch for dy * xhat
        dgamma = ones @ dxb
        dbeta = ones @ dyb
        np.multiply(dyb, gamma, out=dxb)              # dxhat
        mean_dxhat = (dxb @ inv_d)[:, None]
        t = dxb * hb
        mean_dxhat_xhat = (t @ inv_d)[:, None]
        np.multiply(hb, mean_dxhat_xhat, out=t)
        dxb -= mean_dxhat
        dxb -= t
        dxb *= rb
        return dgamma, dbeta

    parts = parallel_rows(block, dy, xhat, r, dx, chunk_elements=LN_BLOCK)
    return dx, sum(g for g, _ in parts), sum(b for _, b in parts)
