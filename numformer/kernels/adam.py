"""Fast Adam on the host: every tensor cut into cache-sized blocks, the blocks spread over the threads.

Same inputs and effect as :func:`numformer.optim.adam_update` (in place on the parameters
and moments, bit for bit the same arithmetic): each block runs the dozen ufunc passes
of the update with one scratch buffer while it is in cache, then zeroes its gradient
if asked (instead of a second pass over every gradient afterwards).
Block size measured (base, 52M parameters, 2 threads): 1<<15 136 ms, 1<<16 106 ms,
1<<17 88 ms, 1<<18 87 ms, 1<<19 96 ms, 1<<22 104 ms.

On a GPU (issue 60, item 1): one CUDA kernel (:data:`ADAM_CUDA`) updates the whole parameter buffer in one
launch per dtype, where the plain math launches a dozen cupy kernels (and, per tensor, did so 253 times a
step); the gradient norm is two launches for the whole buffer (:func:`grad_norm_cuda`). The step's changing
scalars are read from device memory and a device flag can drop the update, so the step can be captured once
as a CUDA graph. It computes each element as the plain math does, one rounding per operation (compiled without
multiply-add contraction: numformer/kernels/cuda_sources.py), with the host's ``1 - b1`` and ``1 - b2`` passed
in, so its result is the plain math's bit for bit. It runs only once a GPU run has proven it
(``cuda_proofs.json``) or with ``NUMFORMER_CUDA_UNPROVEN=1``; otherwise the switch runs the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, is_cupy_array
from ..parameter_buffer import ParameterBuffer
from .cuda_sources import cuda_source, kernel_function, may_run
from .host.threads import parallel_tasks
from .twins import replaces

ADAM_BLOCK = 1 << 17  # elements per block


# The optimizer step's kernels, one source (one proof): the fused Adam update and the gradient norm.
#
# adam_update_<T>: one thread per element, T float or double (the buffer's dtype). The order of operations is
# the plain math's (numformer/optim.py adam_update), each rounded: m = b1 m + (1 - b1) g;
# v = b2 v + (1 - b2) g^2; p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)). step_size and bc2_sqrt (they change
# every step) are read from device memory, `scalars`, so a step captured once as a CUDA graph replays with the
# step's own values written there before the replay; `skip` (device memory too) set nonzero drops the update
# (and still zeroes the gradient when asked): the device's own verdict on a non-finite gradient, which a
# captured step cannot leave to the host.
#
# squares_partials_<T> and norm_finish: the gradient norm of numformer/optim.py grad_norm, sqrt(sum g^2), in
# two launches however many tensors: each block sums its grid-stride share of g^2 in double, a tree sum in
# shared memory, into partials[first + block]; one block then sums the partials in a fixed order (the same
# bits at every run: no atomics) and writes the norm and whether it is finite (s - s == 0 is false for inf
# and nan, without isfinite's library call). The plain math sums rows of 4,096 squares in the gradient's own
# dtype before adding rows in float64; here every square is a double: as accurate or more, not bit-equal.
ADAM_CUDA = cuda_source("adam", r"""
#define NORM_THREADS 256

template <typename T>
__device__ void adam_element(T* p, T* g, T* m, T* v, long long i, T step_size, T b1, T one_minus_b1, T b2,
                             T one_minus_b2, T bc2_sqrt, T eps, int zero_grad) {
    T gi = g[i];
    T mi = b1 * m[i] + one_minus_b1 * gi;
    T vi = b2 * v[i] + one_minus_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - step_size * (mi / (sqrt(vi) / bc2_sqrt + eps));
    if (zero_grad) g[i] = 0;
}

#define ADAM_KERNEL(NAME, T)                                                                                     \
extern "C" __global__ void NAME(T* p, T* g, T* m, T* v, long long n, const T* scalars, const int* skip, T b1,   \
                                T one_minus_b1, T b2, T one_minus_b2, T eps, int zero_grad) {                 \
    T step_size = scalars[0], bc2_sqrt = scalars[1];                                                          \
    int skipped = skip[0];                                                                                    \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                                 \
         i += (long long)blockDim.x * gridDim.x) {                                                            \
        if (skipped) { if (zero_grad) g[i] = 0; }                                                             \
        else adam_element<T>(p, g, m, v, i, step_size, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps,    \
                             zero_grad);                                                                      \
    }                                                                                                         \
}

ADAM_KERNEL(adam_update_float32, float)
ADAM_KERNEL(adam_update_float64, double)

// The block's NORM_THREADS values s added as a tree in shared memory, in a fixed order; every thread returns
// the sum.
__device__ double norm_block_sum(double s, double* sums) {
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int half = NORM_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    double total = sums[0];
    __syncthreads();
    return total;
}

template <typename T>
__device__ void squares_partials(const T* g, long long n, double* partials) {
    __shared__ double sums[NORM_THREADS];
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        double gi = (double)g[i];
        s += gi * gi;
    }
    double total = norm_block_sum(s, sums);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

extern "C" __global__ void squares_partials_float32(const float* g, long long n, double* partials) {
    squares_partials<float>(g, n, partials);
}
extern "C" __global__ void squares_partials_float64(const double* g, long long n, double* partials) {
    squares_partials<double>(g, n, partials);
}

extern "C" __global__ void norm_finish(const double* partials, int count, double* norm, int* nonfinite) {
    __shared__ double sums[NORM_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += NORM_THREADS) s += partials[i];
    double total = norm_block_sum(s, sums);
    if (threadIdx.x == 0) {
        norm[0] = sqrt(total);
        nonfinite[0] = !(total - total == 0.0);
    }
}
""")
CUDA_THREADS, CUDA_BLOCKS = 256, 4096  # Adam: a grid-stride loop, 1M threads cover any buffer
NORM_THREADS, NORM_BLOCKS = 256, 1024  # the norm: 1,024 partial sums per array (NORM_THREADS as in the source)


def _contiguous(arrays) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def _runs_here(params, grads, ms, vs, *args, **kwargs) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and every array is
    contiguous (the parameter buffer's flat arrays are)."""
    if not (params and is_cupy_array(params[0])):
        return True
    return may_run("adam") and _contiguous([*params, *grads, *ms, *vs])


def step_scalars(xp, dtype, step_size: float, bc2_sqrt: float):
    """The device array :data:`ADAM_CUDA` reads the step's ``step_size`` and ``bc2_sqrt`` from (a captured step
    writes the next step's values into its own copy of it before each replay). Written element by element:
    on a GPU each is a fill kernel queued behind the step's work, where a copy of a host array would wait for it."""
    scalars = xp.empty(2, dtype=dtype)
    write_step_scalars(scalars, step_size, bc2_sqrt)
    return scalars


def write_step_scalars(scalars, step_size: float, bc2_sqrt: float) -> None:
    """Put ``step_size`` and ``bc2_sqrt`` into a :func:`step_scalars` array, without a host sync."""
    scalars[0] = step_size
    scalars[1] = bc2_sqrt


def adam_update_cuda(params, grads, ms, vs, step_size: float, b1: float, b2: float, bc2_sqrt: float, eps: float,
                     zero_grad: bool = False, scalars=None, skip=None) -> None:
    """:func:`numformer.optim.adam_update` on cupy arrays: one launch of :data:`ADAM_CUDA` per array (numpy scalars,
    which cupy's RawKernel takes as it takes its own: numpy arrays run it under the host emulator's ``emulated()``).

    ``scalars``: {dtype: :func:`step_scalars` array} already on the device (a captured step's), else made here from
    ``step_size`` and ``bc2_sqrt``; ``skip``: a device int32 array of one element, nonzero to drop the update
    (:func:`grad_norm_cuda`'s ``nonfinite``), else none is dropped."""
    for p, g, m, v in zip(params, grads, ms, vs):
        dtype = p.dtype.type
        xp = get_array_module(p)
        on_device = (scalars or {}).get(p.dtype.name)
        if on_device is None:
            on_device = step_scalars(xp, dtype, step_size, bc2_sqrt)
        dropped = xp.zeros(1, dtype=np.int32) if skip is None else skip
        constants = [dtype(x) for x in (b1, 1.0 - b1, b2, 1.0 - b2, eps)]
        function = kernel_function("adam", f"adam_update_{p.dtype.name}")
        blocks = min(CUDA_BLOCKS, -(-p.size // CUDA_THREADS)) or 1
        function((blocks,), (CUDA_THREADS,), (p, g, m, v, np.int64(p.size), on_device, dropped, *constants,
                                              np.int32(bool(zero_grad))))


def grad_norm_cuda(grads, nonfinite=None):
    """:func:`numformer.optim.grad_norm` of whole gradient arrays (a parameter buffer's) in two launches of
    :data:`ADAM_CUDA`'s norm kernels for all of them: a 0-d float64 array. ``nonfinite``: a device int32 array of
    one element that receives whether the norm is inf or nan (what :func:`adam_update_cuda`'s ``skip`` reads)."""
    xp = get_array_module(grads[0])
    partials = xp.zeros(NORM_BLOCKS * len(grads), dtype=np.float64)
    for i, g in enumerate(grads):
        function = kernel_function("adam", f"squares_partials_{g.dtype.name}")
        blocks = min(NORM_BLOCKS, -(-g.size // NORM_THREADS)) or 1
        function((blocks,), (NORM_THREADS,), (g, np.int64(g.size), partials[i * NORM_BLOCKS:]))
    norm = xp.zeros(1, dtype=np.float64)
    flag = xp.zeros(1, dtype=np.int32) if nonfinite is None else nonfinite
    kernel_function("adam", "norm_finish")((1,), (NORM_THREADS,), (partials, np.int32(partials.size), norm, flag))
    return norm.reshape(())


def _norm_runs_here(params) -> bool:
    """Whole gradient arrays (a parameter buffer) on the device, when the kernel may run; else the plain math."""
    if not isinstance(params, ParameterBuffer):
        return False
    grads = params.grads
    return bool(grads) and is_cupy_array(grads[0]) and may_run("adam") and _contiguous(grads) and \
        all(g.dtype in (np.float32, np.float64) for g in grads)


@replaces("numformer.optim.grad_norm", when=_norm_runs_here)
def grad_norm_fast(params):
    return grad_norm_cuda(params.grads)


@replaces("numformer.optim.adam_update", when=_runs_here)
def adam_update_fast(params, grads, ms, vs, step_size: float, b1: float, b2: float, bc2_sqrt: float, eps: float,
                     zero_grad: bool = False) -> None:
    if params and is_cupy_array(params[0]):
        return adam_update_cuda(params, grads, ms, vs, step_size, b1, b2, bc2_sqrt, eps, zero_grad)

    def update(pc, gc, mc, vc):
        tmp = np.multiply(gc, 1.0 - b1)
        mc *= b1
        mc += tmp
        np.multiply(gc, gc, out=tmp)
        tmp *= 1.0 - b2
        vc *= b2
        vc += tmp
        np.sqrt(vc, out=tmp)
        tmp /= bc2_sqrt
        tmp += eps
        np.divide(mc, tmp, out=tmp)
        tmp *= step_size
        pc -= tmp
        if zero_grad:
            gc.fill(0)

    tasks, sizes = [], []
    for arrays in zip(params, grads, ms, vs):
        n = arrays[0].size
        if all(a.flags.c_contiguous for a in arrays) and n > ADAM_BLOCK:
            flat = [a.reshape(-1) for a in arrays]  # views: contiguous
            for i in range(0, n, ADAM_BLOCK):
                tasks.append(tuple(f[i:i + ADAM_BLOCK] for f in flat))
                sizes.append(min(ADAM_BLOCK, n - i))
        else:
            tasks.append(arrays)
            sizes.append(n)
    parallel_tasks(update, tasks, sizes)
    return None
