"""Fast Linear forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.linear.linear_forward` / ``linear_backward``.

* forward: the bias is added in place on the GEMM's fresh output (``y += b``), where the plain
  ``y + b`` writes a second (n, d_out) array: one memory pass instead of a read, a write and a new
  allocation;
* backward: the bias gradient, a column sum, is a GEMV with a ones vector (BLAS, threaded)
  instead of numpy's one-thread ``.sum(axis=0)``.

Measured at the ``small`` training shape (2,560 rows) on a 2-core Intel Xeon (AVX-512), float32:
the bias add 0.99 -> 0.74 ms at d_out 1,024 and 0.51 -> 0.16 ms at 256; the column sum 0.54 -> 0.21 ms
and 0.14 -> 0.06 ms (the whole call against the plain one: ``bench/kernel_speed.py``; docs/speed.md).
A threaded bias add (row blocks in the host threads) measured slower than this one-thread in-place add,
so there is none.

On a GPU (issue 60, item 2): the bias gradient's column sum is two CUDA kernels (:data:`LINEAR_CUDA`, kernel
``linear``), where cupy's ``dy.sum(axis=0)`` cost as much as a GEMM in TF32 (docs/gpu.md): ``column_partials``
sums chunks of rows of each column (one partial per chunk, no atomics), ``column_sums`` adds the partials in a
fixed order: deterministic, equal to the plain sum up to the order of the additions. The GEMMs stay cupy's.
The two-stage column sum (:data:`COLUMN_SUMS_CUDA`) is shared with LayerNorm's dgamma and dbeta
(numformer/kernels/layernorm.py). It runs only once a GPU run has proven it (``cuda_proofs.json``) or with
``NUMFORMER_CUDA_UNPROVEN=1``; otherwise the switch runs the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, is_cupy_array, matmul
from . import cuda_sources
from .cuda_sources import cuda_source
from .twins import on_host, replaces

# The second stage of every column sum (a (p, d) array of partial sums -> (d,)), included in each source that
# needs it (a source is compiled alone). A block of 256 threads takes 32 columns, 8 lanes each (consecutive
# threads read consecutive columns): lane l adds partials l, l + 8, l + 16, ... in order, then the 8 lanes are
# added as a tree in shared memory (lanes 0+4, 1+5, ...; then 0+2, 1+3; then 0+1): a fixed order, no atomics.
COLUMN_SUMS_CUDA = r"""
#define CS_COLS 32
#define CS_LANES 8
#define CS_THREADS 256  /* CS_COLS * CS_LANES */

template <typename T>
__device__ void column_sums_of(const T* part, T* out, long long p, long long d, T* sh) {
    const int col_in = threadIdx.x % CS_COLS;
    const int lane = threadIdx.x / CS_COLS;
    for (long long c0 = (long long)blockIdx.x * CS_COLS; c0 < d; c0 += (long long)gridDim.x * CS_COLS) {
        const long long c = c0 + col_in;
        T s = 0;
        if (c < d)
            for (long long i = lane; i < p; i += CS_LANES) s = s + part[i * d + c];
        sh[threadIdx.x] = s;
        __syncthreads();
        for (int w = CS_LANES / 2; w > 0; w >>= 1) {
            if (lane < w) sh[threadIdx.x] = sh[threadIdx.x] + sh[threadIdx.x + w * CS_COLS];
            __syncthreads();
        }
        if (lane == 0 && c < d) out[c] = sh[col_in];
        __syncthreads();
    }
}

#define COLUMN_SUMS_KERNEL(NAME, T)                                                      \
extern "C" __global__ void NAME(const T* part, T* out, long long p, long long d) {      \
    __shared__ T sh[CS_THREADS];                                                         \
    column_sums_of<T>(part, out, p, d, sh);                                              \
}

COLUMN_SUMS_KERNEL(column_sums_float32, float)
COLUMN_SUMS_KERNEL(column_sums_float64, double)
"""
CS_THREADS, CS_COLS, CS_MAX_BLOCKS = 256, 32, 4096


def column_sums_of_partials_cuda(kernel_name: str, partials):
    """(p, d) partial sums -> (d,) their column sums, by ``column_sums`` of kernel ``kernel_name``'s source."""
    xp = get_array_module(partials)
    p, d = partials.shape
    out = xp.empty(d, dtype=partials.dtype)
    function = cuda_sources.kernel_function(kernel_name, f"column_sums_{partials.dtype.name}")
    blocks = min(CS_MAX_BLOCKS, -(-d // CS_COLS))
    function((blocks,), (CS_THREADS,), (partials, out, np.int64(p), np.int64(d)))
    return out


# The bias gradient db = dy.sum(axis=0) (numformer/layers/linear.py linear_backward): the rows cut into chunks of
# ``rows_per_chunk``; one block of 256 threads takes one chunk of 256 columns (a grid-stride loop over
# (chunk, column tile) pairs), each thread adding its column's rows in order into partial[chunk, column]; then
# ``column_sums`` (above) adds the chunks' partials. One rounding per addition, in the row's dtype.
LINEAR_CUDA = cuda_source("linear", COLUMN_SUMS_CUDA + r"""
#define CP_THREADS 256

template <typename T>
__device__ void column_partials_of(const T* a, T* part, long long n, long long d, long long rows_per_chunk) {
    const long long tiles = (d + CP_THREADS - 1) / CP_THREADS;
    const long long chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
    for (long long task = blockIdx.x; task < chunks * tiles; task += gridDim.x) {
        const long long chunk = task / tiles;
        const long long c = (task % tiles) * CP_THREADS + threadIdx.x;
        if (c < d) {
            const long long r0 = chunk * rows_per_chunk;
            const long long r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
            T s = 0;
            for (long long i = r0; i < r1; ++i) s = s + a[i * d + c];
            part[chunk * d + c] = s;
        }
    }
}

#define COLUMN_PARTIALS_KERNEL(NAME, T)                                                                   \
extern "C" __global__ void NAME(const T* a, T* part, long long n, long long d, long long rows_per_chunk) { \
    column_partials_of<T>(a, part, n, d, rows_per_chunk);                                                 \
}

COLUMN_PARTIALS_KERNEL(column_partials_float32, float)
COLUMN_PARTIALS_KERNEL(column_partials_float64, double)
""")
CP_THREADS, CP_MAX_BLOCKS = 256, 1 << 16
MIN_ROWS_PER_CHUNK, MAX_CHUNKS = 64, 1024  # at most 1024 partials a column (the scratch array: 1024 x d)
_FLOATS = ("float32", "float64")


def _add_to_rows_(y, b) -> None:
    """``y[i] += b`` for every row i, in place."""
    np.add(y, b, out=y)


def _column_sums(a):
    """``a.sum(axis=0)`` as one GEMV: ``1^T a``."""
    return np.ones(a.shape[0], dtype=a.dtype) @ a


def bias_gradient_fits(dy) -> bool:
    """Whether ``dy`` is what :func:`bias_gradient_cuda` takes: a C-contiguous (n >= 1, d >= 1) float32/64 array."""
    return (dy.ndim == 2 and dy.dtype.name in _FLOATS and dy.flags.c_contiguous and dy.shape[0] >= 1
            and dy.shape[1] >= 1)


def bias_gradient_cuda(dy):
    """``dy.sum(axis=0)`` (dy (n, d) -> (d,)) by :data:`LINEAR_CUDA`: partial sums of chunks of rows, then their
    sum. Takes cupy arrays (numpy arrays under the host emulator's ``emulated()``)."""
    xp = get_array_module(dy)
    n, d = dy.shape
    rows_per_chunk = max(MIN_ROWS_PER_CHUNK, -(-n // MAX_CHUNKS))
    chunks = -(-n // rows_per_chunk)
    partials = xp.empty((chunks, d), dtype=dy.dtype)
    function = cuda_sources.kernel_function("linear", f"column_partials_{dy.dtype.name}")
    blocks = min(CP_MAX_BLOCKS, chunks * -(-d // CP_THREADS))
    function((blocks,), (CP_THREADS,), (dy, partials, np.int64(n), np.int64(d), np.int64(rows_per_chunk)))
    return column_sums_of_partials_cuda("linear", partials)


def linear_backward_cuda(dy, x, w, with_bias: bool):
    """:func:`numformer.layers.linear.linear_backward` on cupy arrays: the GEMMs as the plain math does them
    (:func:`numformer.backend.matmul`), the bias gradient by :func:`bias_gradient_cuda`."""
    db = bias_gradient_cuda(dy) if with_bias else None
    return matmul(dy, w.T), matmul(x.T, dy), db


def _backward_runs_here(dy, x, w, with_bias: bool) -> bool:
    """Host arrays always; device arrays when there is a bias gradient, the CUDA kernel may run (proven, or
    opted in) and ``dy`` fits (the plain math runs otherwise)."""
    if not is_cupy_array(dy):
        return True
    return bool(with_bias) and cuda_sources.may_run("linear") and bias_gradient_fits(dy)


@replaces("numformer.layers.linear.linear_forward", when=on_host)
def linear_forward_fast(x, w, b):
    y = matmul(x, w)
    if b is not None:
        _add_to_rows_(y, b)  # y is the GEMM's own new array: writing it in place is safe
    return y


@replaces("numformer.layers.linear.linear_backward", when=_backward_runs_here)
def linear_backward_fast(dy, x, w, with_bias: bool):
    if is_cupy_array(dy):
        return linear_backward_cuda(dy, x, w, with_bias)
    db = _column_sums(dy) if with_bias else None
    return matmul(dy, w.T), matmul(x.T, dy), db
