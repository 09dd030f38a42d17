"""Fused dropout on a GPU: the mask made in the kernel from the counter stream, scale and residual add, one launch.

The fast twin of :func:`numformer.layers.dropout.dropout_forward` for cupy arrays (issue 60, item 2):
``y = x * m (+ add)`` with ``m`` the mask of :func:`numformer.layers.dropout.dropout_mask`, where the plain math
runs the generator's ten Philox rounds as some seventy array operations, the mask, the product and the sum as
more, each a launch and a pass over memory. One thread per Philox counter (eight elements): it computes
Philox4x32-10 of its counter (:data:`PHILOX_CUDA`, the CUDA twin of :func:`numformer.counter_rng.philox4x32_10`),
and for each of its eight elements the 16-bit number, the mask value ``m = [u >= t] * scale``, ``y = x * m``
and ``y + add`` (in that order, each rounded: compiled with ``--fmad=false``), so ``y`` and ``m`` are the plain
math's bit for bit. The seed and offset are read from the generator's device state (``rng.counter``) and a
second, one-thread launch (``counter_advance``) moves the offset by the counters used: nothing is read back to
the host, and a CUDA graph that replays the two launches draws new masks each time.

Host (numpy) arrays have no dropout kernel (docs/speed.md has the measurements): the switch runs the plain math
for them. On a GPU the kernel runs once a GPU run has proven it (``cuda_proofs.json``) or with
``NUMFORMER_CUDA_UNPROVEN=1``; otherwise the plain math (the same masks, from the same stream).

Launch shape: ``DROPOUT_THREADS`` (256) threads a block, one block per 256 counters up to ``MAX_BLOCKS``, a
grid-stride loop beyond.
"""
from __future__ import annotations

import numpy as np

from .. import counter_rng
from ..backend import get_array_module, is_cupy_array
from .cuda_sources import cuda_source, kernel_function, may_run
from .twins import replaces

# Philox4x32-10 (Salmon et al. 2011; numformer/counter_rng.py states the definition): the four output words of
# counter (c0, c1, c2, c3) under key (k0, k1). Shared with the attention kernels' source (numformer/kernels/
# attention.py) by string: each kernel source is compiled on its own.
PHILOX_CUDA = r"""
#define NF_PHILOX_M0 0xD2511F53u
#define NF_PHILOX_M1 0xCD9E8D57u
#define NF_PHILOX_W0 0x9E3779B9u
#define NF_PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ void nf_philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += NF_PHILOX_W0; k1 += NF_PHILOX_W1; }
        unsigned long long p0 = (unsigned long long)NF_PHILOX_M0 * c[0];
        unsigned long long p1 = (unsigned long long)NF_PHILOX_M1 * c[2];
        unsigned int hi0 = (unsigned int)(p0 >> 32), lo0 = (unsigned int)p0;
        unsigned int hi1 = (unsigned int)(p1 >> 32), lo1 = (unsigned int)p1;
        c[0] = hi1 ^ c[1] ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c[3] ^ k1;
        c[3] = lo0;
    }
}

// The words of counter offset + t of the stream whose state is [seed, offset] (numformer/counter_rng.py).
__device__ __forceinline__ void nf_stream_words(const unsigned long long* state, unsigned long long t,
                                                unsigned int w[4]) {
    unsigned long long seed = state[0], c = state[1] + t;
    w[0] = (unsigned int)c; w[1] = (unsigned int)(c >> 32); w[2] = 0u; w[3] = 0u;
    nf_philox4x32_10(w, (unsigned int)seed, (unsigned int)(seed >> 32));
}

// Half h (0..7, low half first) of the four words: the stream's 16-bit number 8 t + h.
__device__ __forceinline__ unsigned int nf_half(const unsigned int w[4], int h) {
    return (w[h >> 1] >> (16 * (h & 1))) & 0xFFFFu;
}

// The state moves past `counters` counters: one thread (a separate launch after the kernels that read it).
extern "C" __global__ void counter_advance(unsigned long long* state, unsigned long long counters) {
    if (blockIdx.x == 0 && threadIdx.x == 0) state[1] += counters;
}
"""

DROPOUT_CUDA = cuda_source("dropout", PHILOX_CUDA + r"""
// The stream's words for counters offset .. offset + blocks - 1, four per counter (the generator's test).
extern "C" __global__ void philox_stream_words(const unsigned long long* state, unsigned int* out,
                                               long long blocks) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < blocks;
         t += (long long)blockDim.x * gridDim.x) {
        unsigned int w[4];
        nf_stream_words(state, (unsigned long long)t, w);
        for (int j = 0; j < 4; ++j) out[4 * t + j] = w[j];
    }
}

// y = x * m (+ add), m = [u >= threshold] * scale, u the stream's number i (numformer/layers/dropout.py).
template <typename T, bool ADD>
__device__ void dropout_body(const T* x, const T* add, T* y, T* m, const unsigned long long* state, long long n,
                             unsigned int threshold, T scale) {
    long long counters = (n + 7) / 8;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < counters;
         t += (long long)blockDim.x * gridDim.x) {
        unsigned int w[4];
        nf_stream_words(state, (unsigned long long)t, w);
        for (int h = 0; h < 8; ++h) {
            long long i = 8 * t + h;
            if (i >= n) break;
            T mi = nf_half(w, h) >= threshold ? scale : (T)0;
            T yi = x[i] * mi;
            if (ADD) yi = yi + add[i];
            m[i] = mi;
            y[i] = yi;
        }
    }
}

#define DROPOUT_KERNELS(SUFFIX, T)                                                                             \
extern "C" __global__ void dropout_forward_##SUFFIX(const T* x, T* y, T* m, const unsigned long long* state,     \
                                                    long long n, unsigned int threshold, T scale) {            \
    dropout_body<T, false>(x, x, y, m, state, n, threshold, scale);                                            \
}                                                                                                              \
extern "C" __global__ void dropout_forward_add_##SUFFIX(const T* x, const T* add, T* y, T* m,                   \
                                                        const unsigned long long* state, long long n,          \
                                                        unsigned int threshold, T scale) {                     \
    dropout_body<T, true>(x, add, y, m, state, n, threshold, scale);                                           \
}

DROPOUT_KERNELS(float32, float)
DROPOUT_KERNELS(float64, double)
""")
DROPOUT_THREADS, MAX_BLOCKS = 256, 1 << 16
DTYPES = ("float32", "float64")


def _grid(work: int) -> tuple:
    return (min(MAX_BLOCKS, -(-work // DROPOUT_THREADS)) or 1,)


def advance_cuda(kernel_name: str, state, n: int) -> None:
    """Move ``state`` past a draw of ``n`` numbers on the device (``counter_advance`` of kernel ``kernel_name``'s
    source: one thread): the effect of :func:`numformer.counter_rng.advance`."""
    kernel_function(kernel_name, "counter_advance")((1,), (1,), (state, np.uint64(counter_rng.counters(n))))


def philox_stream_words_cuda(state, blocks: int):
    """The stream's 32-bit words for ``blocks`` counters from ``state``'s offset ((blocks, 4) uint32), computed
    by the CUDA generator (not advancing the state): what the tests hold against counter_rng's."""
    xp = get_array_module(state)
    out = xp.empty((blocks, 4), dtype=xp.uint32)
    kernel_function("dropout", "philox_stream_words")(_grid(blocks), (DROPOUT_THREADS,), (state, out,
                                                                                          np.int64(blocks)))
    return out


def dropout_forward_cuda(x, state, p: float, add=None, out=None):
    """:func:`numformer.layers.dropout.dropout_forward` with the counter stream at ``state`` (the generator's
    ``counter``): -> (y, m), the state advanced by ``ceil(n / 8)`` on the device. Arrays of one module (cupy, or
    numpy under the host emulator), contiguous, float32 or float64; ``out``: (y, m) buffers of x's shape and dtype
    to write (nothing allocated: what a captured CUDA graph needs), else new arrays."""
    xp = get_array_module(x)
    n = x.size
    threshold = int(round(p * 65536))
    scale = x.dtype.type(65536.0 / (65536 - threshold))
    y, m = (xp.empty_like(x), xp.empty_like(x)) if out is None else out
    suffix = x.dtype.name
    if n:
        grid = _grid(counter_rng.counters(n))
        if add is None:
            kernel_function("dropout", f"dropout_forward_{suffix}")(
                grid, (DROPOUT_THREADS,), (x, y, m, state, np.int64(n), np.uint32(threshold), scale))
        else:
            kernel_function("dropout", f"dropout_forward_add_{suffix}")(
                grid, (DROPOUT_THREADS,), (x, add, y, m, state, np.int64(n), np.uint32(threshold), scale))
    advance_cuda("dropout", state, n)
    return y, m


def _fits(x, rng, p, add=None) -> bool:
    """What the kernel takes: a philox generator, contiguous float32/float64 arrays, ``add`` of x's shape and dtype,
    and a threshold below 2^16 (p < 1 - 2^-17)."""
    return (getattr(rng, "counter", None) is not None and x.dtype.name in DTYPES and x.flags.c_contiguous
            and (add is None or (add.shape == x.shape and add.dtype == x.dtype and add.flags.c_contiguous))
            and 0 <= round(p * 65536) < 65536)


def _runs_here(x, rng, p, add=None) -> bool:
    """cupy arrays, when the CUDA kernel may run (proven, or opted in) and the arguments fit; host arrays never
    (the plain math: there is no host dropout kernel)."""
    return is_cupy_array(x) and may_run("dropout") and _fits(x, rng, p, add)


@replaces("numformer.layers.dropout.dropout_forward", when=_runs_here)
def dropout_forward_fast(x, rng, p: float, add=None):
    """-> (y, m) as the plain math, from the generator's philox stream (``rng.counter``), in one launch (and a
    one-thread launch moving the offset)."""
    if getattr(rng, "counter", None) is None:
        raise TypeError("the fused dropout draws from a philox generator (the GPU's RandomState); this one is "
                        f"{getattr(rng, 'kind', type(rng).__name__)}")
    return dropout_forward_cuda(x, rng.counter, p, add)
