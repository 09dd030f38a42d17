"""Fast Adam on the host: every tensor cut into cache-sized blocks, the blocks spread over the threads.

Same inputs and effect as :func:`numformer.optim.adam_update` (in place on the parameters
and moments, bit for bit the same arithmetic): each block runs the dozen ufunc passes
of the update with one scratch buffer while it is in cache, then zeroes its gradient
if asked (instead of a second pass over every gradient afterwards).
Block size measured (base, 52M parameters, 2 threads): 1<<15 136 ms, 1<<16 106 ms,
1<<17 88 ms, 1<<18 87 ms, 1<<19 96 ms, 1<<22 104 ms.

On a GPU (issue 60, item 1): one CUDA kernel (:data:`ADAM_CUDA`) updates the whole parameter buffer in one
launch per dtype, where the plain math launches a dozen cupy kernels (and, per tensor, did so 253 times a
step). It computes each element as the plain math does, one rounding per operation (compiled without
multiply-add contraction: numformer/kernels/cuda_sources.py), with the host's ``1 - b1`` and ``1 - b2`` passed
in, so its result is the plain math's bit for bit. It runs only once a GPU run has proven it
(``cuda_proofs.json``) or with ``NUMFORMER_CUDA_UNPROVEN=1``; otherwise the switch runs the plain math.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from .cuda_sources import cuda_source, kernel_function, may_run
from .host.threads import parallel_tasks
from .twins import replaces

ADAM_BLOCK = 1 << 17  # elements per block


# One thread per element; T is float or double (the buffer's dtype). The order of operations is the plain
# math's (numformer/optim.py adam_update), each rounded: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
# p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)).
ADAM_CUDA = cuda_source("adam", r"""
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
extern "C" __global__ void NAME(T* p, T* g, T* m, T* v, long long n, T step_size, T b1, T one_minus_b1, T b2,  \
                                T one_minus_b2, T bc2_sqrt, T eps, int zero_grad) {                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                                 \
         i += (long long)blockDim.x * gridDim.x)                                                              \
        adam_element<T>(p, g, m, v, i, step_size, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, zero_grad);\
}

ADAM_KERNEL(adam_update_float32, float)
ADAM_KERNEL(adam_update_float64, double)
""")
CUDA_THREADS, CUDA_BLOCKS = 256, 4096  # a grid-stride loop: 1M threads cover any buffer


def _contiguous(arrays) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def _runs_here(params, grads, ms, vs, *args, **kwargs) -> bool:
    """Host arrays always; device arrays when the CUDA kernel may run (proven, or opted in) and every array is
    contiguous (the parameter buffer's flat arrays are)."""
    if not (params and is_cupy_array(params[0])):
        return True
    return may_run("adam") and _contiguous([*params, *grads, *ms, *vs])


def adam_update_cuda(params, grads, ms, vs, step_size: float, b1: float, b2: float, bc2_sqrt: float, eps: float,
                     zero_grad: bool = False) -> None:
    """:func:`numformer.optim.adam_update` on cupy arrays: one launch of :data:`ADAM_CUDA` per array (numpy scalars,
    which cupy's RawKernel takes as it takes its own: numpy arrays run it under the host emulator's ``emulated()``)."""
    for p, g, m, v in zip(params, grads, ms, vs):
        dtype = p.dtype.type
        scalars = [dtype(x) for x in (step_size, b1, 1.0 - b1, b2, 1.0 - b2, bc2_sqrt, eps)]
        function = kernel_function("adam", f"adam_update_{p.dtype.name}")
        blocks = min(CUDA_BLOCKS, -(-p.size // CUDA_THREADS)) or 1
        function((blocks,), (CUDA_THREADS,), (p, g, m, v, np.int64(p.size), *scalars, np.int32(bool(zero_grad))))


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
