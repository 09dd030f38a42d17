"""Fast label-smoothed cross-entropy on the host: one blocked pass over the logits each way.

Same inputs and outputs as :func:`numformer.loss.smoothed_cross_entropy` and
``smoothed_cross_entropy_backward``. The (tokens, vocab) logits dominate the memory
traffic of a small model's step, so each direction reads them once: per block of rows
(about ``LOSS_BLOCK`` elements, cache-sized, spread over the host threads) forward takes
the row max and sum, ``exp(z - max)``, its row sum and the normalised ``p``; backward
turns ``p`` into the gradient in place (``p`` is consumed). With ``overwrite=True`` p is
written over the logits' own buffer (one (tokens, vocab) array fewer).

On a GPU (issue 60, item 2): one CUDA kernel a direction (:data:`LOSS_CUDA`, kernel ``loss``), where the plain
math launches a cupy kernel per array operation over the (tokens, vocab) logits. Forward: one block of 256
threads a row (a grid-stride loop over the rows), three passes over the row (max and sum; the sum of
``exp(z - max)``; ``p``, written over z with ``overwrite``), the row's sums as trees in shared memory.
Backward: ``(p - eps / V - (1 - eps) [k == y]) * weight``, element by element, in place over p as the host
kernel does. Each element is computed in the plain math's order, one rounding per operation (compiled without
multiply-add contraction); only forward's row sums add in another order than numpy's and cupy's. They run
only once a GPU run has proven them (``cuda_proofs.json``) or with ``NUMFORMER_CUDA_UNPROVEN=1``; otherwise
the switch runs the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, is_cupy_array
from . import cuda_sources
from .cuda_sources import cuda_source
from .host.threads import parallel_rows
from .twins import replaces

LOSS_BLOCK = 1 << 17  # elements per block (about L2-sized)

# numformer/loss.py, per row z of V logits with target t, in its order of operations (T: the row's dtype, every
# sum in T; one_minus_eps = T(1 - eps), shift = T(eps / V) are rounded on the host as cupy rounds Python
# scalars):
#   forward:  zmax = max(z); zsum = sum(z); sumexp = sum(exp(z - zmax)); lse = zmax + log(sumexp);
#             nll = lse - z[t]; loss = one_minus_eps * nll + eps * (lse - zsum / V); p = exp(z - zmax) / sumexp
#             (exp recomputed in the third pass, not stored: p may be z's own buffer, and z[t] is read first)
#   backward: dz = (p - shift) [- one_minus_eps where k == t], then * weight[row]; written over p
# A thread takes the columns threadIdx.x, + 256, ... in order, then the block combines the threads' maxima and
# sums as trees in shared memory.
LOSS_CUDA = cuda_source("loss", r"""
#define LOSS_THREADS 256

__device__ inline float loss_exp(float x) { return expf(x); }
__device__ inline double loss_exp(double x) { return exp(x); }
__device__ inline float loss_log(float x) { return logf(x); }
__device__ inline double loss_log(double x) { return log(x); }
__device__ inline float loss_max(float a, float b) { return fmaxf(a, b); }
__device__ inline double loss_max(double a, double b) { return fmax(a, b); }

template <typename T>
__device__ void loss_forward_rows(const T* z, const long long* y, T* loss, T* nll, T* p, long long n, long long v,
                                  T eps, T one_minus_eps, int keep_probs, T* sh_a, T* sh_b) {
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < n; row += gridDim.x) {
        const T* zr = z + row * v;
        const T zy = zr[y[row]];  // before any thread writes p (which may be z): the trees below synchronise
        T m = zr[0], s = 0;
        for (long long c = t; c < v; c += LOSS_THREADS) {
            const T zc = zr[c];
            m = loss_max(m, zc);
            s = s + zc;
        }
        sh_a[t] = m;
        sh_b[t] = s;
        __syncthreads();
        for (int w = LOSS_THREADS / 2; w > 0; w >>= 1) {
            if (t < w) {
                sh_a[t] = loss_max(sh_a[t], sh_a[t + w]);
                sh_b[t] = sh_b[t] + sh_b[t + w];
            }
            __syncthreads();
        }
        const T zmax = sh_a[0], zsum = sh_b[0];
        __syncthreads();
        T e = 0;
        for (long long c = t; c < v; c += LOSS_THREADS) e = e + loss_exp(zr[c] - zmax);
        sh_a[t] = e;
        __syncthreads();
        for (int w = LOSS_THREADS / 2; w > 0; w >>= 1) {
            if (t < w) sh_a[t] = sh_a[t] + sh_a[t + w];
            __syncthreads();
        }
        const T sumexp = sh_a[0];
        __syncthreads();
        const T lse = zmax + loss_log(sumexp);
        const T nl = lse - zy;
        if (t == 0) {
            nll[row] = nl;
            loss[row] = one_minus_eps * nl + eps * (lse - zsum / (T)v);
        }
        if (keep_probs) {
            T* pr = p + row * v;
            for (long long c = t; c < v; c += LOSS_THREADS) pr[c] = loss_exp(zr[c] - zmax) / sumexp;
        }
    }
}

template <typename T>
__device__ void loss_backward_rows(T* p, const long long* y, const T* weight, long long n, long long v, T shift,
                                   T one_minus_eps) {
    for (long long row = blockIdx.x; row < n; row += gridDim.x) {
        T* pr = p + row * v;
        const long long target = y[row];
        const T w = weight[row];
        for (long long c = threadIdx.x; c < v; c += LOSS_THREADS) {
            T g = pr[c] - shift;
            if (c == target) g = g - one_minus_eps;
            pr[c] = g * w;
        }
    }
}

#define LOSS_KERNELS(SUFFIX, T)                                                                                \
extern "C" __global__ void smoothed_cross_entropy_##SUFFIX(const T* z, const long long* y, T* loss, T* nll,   \
                                                           T* p, long long n, long long v, T eps,              \
                                                           T one_minus_eps, int keep_probs) {                  \
    __shared__ T sh_a[LOSS_THREADS];                                                                           \
    __shared__ T sh_b[LOSS_THREADS];                                                                           \
    loss_forward_rows<T>(z, y, loss, nll, p, n, v, eps, one_minus_eps, keep_probs, sh_a, sh_b);                \
}                                                                                                              \
extern "C" __global__ void smoothed_cross_entropy_backward_##SUFFIX(T* p, const long long* y, const T* weight, \
                                                                    long long n, long long v, T shift,         \
                                                                    T one_minus_eps) {                         \
    loss_backward_rows<T>(p, y, weight, n, v, shift, one_minus_eps);                                           \
}

LOSS_KERNELS(float32, float)
LOSS_KERNELS(float64, double)
""")
LOSS_THREADS, LOSS_BLOCKS = 256, 1 << 16  # a grid-stride loop over the rows
_FLOATS = ("float32", "float64")
_IDS = ("int32", "int64", "uint32", "uint64", "int16", "uint16", "int8", "uint8")


def _rows_fit(a, y, n_extra=()) -> bool:
    """a (n >= 1, V >= 1) C-contiguous float32/64, y (n,) integer ids, extra arrays (n,) of a's dtype."""
    return (a.ndim == 2 and a.dtype.name in _FLOATS and a.flags.c_contiguous and a.shape[0] >= 1
            and a.shape[1] >= 1 and y.shape == (a.shape[0],) and y.dtype.name in _IDS
            and all(e.shape == (a.shape[0],) and e.dtype == a.dtype for e in n_extra))


def smoothed_cross_entropy_fits(z, y) -> bool:
    """Whether :func:`smoothed_cross_entropy_cuda` takes these: z (n, V) contiguous float32/64, y (n,) ids."""
    return _rows_fit(z, y) and is_cupy_array(y) == is_cupy_array(z)


def smoothed_cross_entropy_backward_fits(p, y, weight) -> bool:
    """Whether :func:`smoothed_cross_entropy_backward_cuda` takes these: p (n, V), y (n,) ids, weight (n,)."""
    return (_rows_fit(p, y, (weight,)) and weight.flags.c_contiguous
            and is_cupy_array(y) == is_cupy_array(p) == is_cupy_array(weight))


def _ids(xp, y):
    """The target ids as the kernel reads them: contiguous int64 (no copy when they are)."""
    return xp.ascontiguousarray(y, dtype=xp.int64)


def smoothed_cross_entropy_cuda(z, y, eps: float, keep_probs: bool = True, overwrite: bool = False):
    """:func:`numformer.loss.smoothed_cross_entropy` by :data:`LOSS_CUDA` (one launch; with ``overwrite`` p is
    written over z). Takes cupy arrays (numpy arrays under the host emulator's ``emulated()``)."""
    xp = get_array_module(z)
    n, v = z.shape
    dtype = z.dtype.type
    loss, nll = xp.empty(n, dtype=z.dtype), xp.empty(n, dtype=z.dtype)
    p = (z if overwrite else xp.empty_like(z)) if keep_probs else None
    function = cuda_sources.kernel_function("loss", f"smoothed_cross_entropy_{z.dtype.name}")
    function((min(n, LOSS_BLOCKS),), (LOSS_THREADS,),
             (z, _ids(xp, y), loss, nll, z if p is None else p, np.int64(n), np.int64(v), dtype(eps),
              dtype(1.0 - eps), np.int32(bool(keep_probs))))
    return loss, nll, p


def smoothed_cross_entropy_backward_cuda(p, y, eps: float, weight):
    """:func:`numformer.loss.smoothed_cross_entropy_backward` by :data:`LOSS_CUDA` (one launch), in place over
    ``p`` (consumed, as by the host kernel); returns it."""
    xp = get_array_module(p)
    n, v = p.shape
    dtype = p.dtype.type
    function = cuda_sources.kernel_function("loss", f"smoothed_cross_entropy_backward_{p.dtype.name}")
    function((min(n, LOSS_BLOCKS),), (LOSS_THREADS,),
             (p, _ids(xp, y), weight, np.int64(n), np.int64(v), dtype(eps / v), dtype(1.0 - eps)))
    return p


def _forward_runs_here(z, y, *args, **kwargs) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and they fit."""
    if not is_cupy_array(z):
        return True
    return cuda_sources.may_run("loss") and smoothed_cross_entropy_fits(z, y)


def _backward_runs_here(p, y, eps, weight) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and they fit."""
    if not is_cupy_array(p):
        return True
    return cuda_sources.may_run("loss") and smoothed_cross_entropy_backward_fits(p, y, weight)


@replaces("numformer.loss.smoothed_cross_entropy", when=_forward_runs_here)
def smoothed_cross_entropy_fast(z, y, eps: float, keep_probs: bool = True, overwrite: bool = False):
    if is_cupy_array(z):
        return smoothed_cross_entropy_cuda(z, y, eps, keep_probs, overwrite)
    n, v = z.shape
    z_y = np.take_along_axis(z, y[:, None], axis=1)[:, 0]   # before z may be overwritten
    zmax, zsum, sumexp = (np.empty(n, dtype=z.dtype) for _ in range(3))
    p = (z if overwrite else np.empty_like(z)) if keep_probs else None

    def block(zb, mb, sb, seb, pb=None):
        np.max(zb, axis=1, out=mb)
        np.sum(zb, axis=1, out=sb)
        eb = np.subtract(zb, mb[:, None], out=pb)
        np.exp(eb, out=eb)
        np.sum(eb, axis=1, out=seb)
        if pb is not None:
            pb /= seb[:, None]

    parallel_rows(block, *((z, zmax, zsum, sumexp) if p is None else (z, zmax, zsum, sumexp, p)),
                  chunk_elements=LOSS_BLOCK)
    lse = zmax + np.log(sumexp)
    nll = lse - z_y
    loss = (1.0 - eps) * nll + eps * (lse - zsum / v)
    return loss, nll, p


@replaces("numformer.loss.smoothed_cross_entropy_backward", when=_backward_runs_here)
def smoothed_cross_entropy_backward_fast(p, y, eps: float, weight):
    if is_cupy_array(p):
        return smoothed_cross_entropy_backward_cuda(p, y, eps, weight)
    shift = eps / p.shape[1]

    def block(pb, wb):
        pb -= shift
        pb *= wb[:, None]

    parallel_rows(block, p, weight, chunk_elements=LOSS_BLOCK)
    p[np.arange(p.shape[0]), y] -= (1.0 - eps) * weight
    return p
