"""The CUDA host emulator (numformer/kernels/cuda_emulator.py) runs a kernel's CUDA C on the CPU, so its logic is
tested in CI against the plain math before a GPU sees it: the fused Adam kernel equals numformer.optim.adam_update
bit for bit, a planted bug does not; __shared__ + __syncthreads, 2D/3D grids, and the refusals (constructs outside
the dialect, arguments cupy would misread) behave as stated. Needs g++ (there on CI's machine), no GPU."""
import math

import numpy as np
import pytest

from numformer.kernels import adam, cuda_emulator, cuda_sources
from numformer.kernels.cuda_emulator import CudaEmulatorArgumentError, CudaEmulatorError, emulated, host_kernel
from numformer.optim import adam_update

# A block tree-sum through a __device__ helper that syncs (the emulator must see that the kernel reaches
# __syncthreads through it), a kernel whose surplus threads return before the barriers, and 2D / 3D index maps.
TOY = r"""
#define MAX_THREADS 1024

template <typename T>
__device__ T block_sum(T* buf, T value) {
    unsigned t = threadIdx.x;
    buf[t] = value;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    return buf[0];
}

extern "C" __global__ void tree_sum(const double* x, long long n, double* out) {
    __shared__ double buf[MAX_THREADS];
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    double total = block_sum<double>(buf, i < n ? x[i] : 0.0);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}

extern "C" __global__ void first_threads_sum(const int* x, int active, int* out) {
    __shared__ int buf[MAX_THREADS];
    if (threadIdx.x >= active) return;  /* these leave the block's barriers */
    buf[threadIdx.x] = x[blockIdx.x * active + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int j = 0; j < active; ++j) s += buf[j];
        out[blockIdx.x] = s;
    }
}

extern "C" __global__ void index_map_2d(int* out, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) out[y * width + x] = x + 1000 * y + 1000000 * (gridDim.x * 10 + gridDim.y);
}

extern "C" __global__ void index_map_3d(int* out, int nx, int ny, int nz) {
    unsigned x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < nx && y < ny && z < nz) out[(z * ny + y) * nx + x] = max(x, 0u) + 100 * y + 10000 * z;
}
"""


def _sums(x, threads, source=TOY):
    blocks = -(-x.size // threads)
    out = np.full(blocks, -1.0)
    host_kernel("toy", "tree_sum", source)((blocks,), (threads,), (x, np.int64(x.size), out))
    return out, np.array([x[b * threads:(b + 1) * threads].sum() for b in range(blocks)])


def _adam_arrays(n, dtype, seed):
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    v = np.abs(rng.standard_normal(n)).astype(dtype)
    return [p, g, m, v]


# Python floats, as the optimizer passes them: a np.float64 scalar would make the plain math of float32 arrays
# promote to float64 (NumPy 2's rule for numpy scalars), and the kernel rightly not
ADAM_STEP = dict(step_size=1e-3 / (1 - 0.9 ** 3), b1=0.9, b2=0.98, bc2_sqrt=math.sqrt(1 - 0.98 ** 3), eps=1e-9)


@pytest.mark.parametrize("zero_grad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 255, 257, 1 << 20])
def test_adam_kernel_equals_the_plain_math_bit_for_bit(n, dtype, zero_grad):
    ours, plain = _adam_arrays(n, dtype, n), _adam_arrays(n, dtype, n)
    with emulated():
        adam.adam_update_cuda(*([a] for a in ours), **ADAM_STEP, zero_grad=zero_grad)
    adam_update(*([a] for a in plain), **ADAM_STEP, zero_grad=zero_grad)
    for name, a, b in zip("pgmv", ours, plain):
        assert a.dtype == dtype and np.array_equal(a, b), name
    assert not np.array_equal(ours[0], _adam_arrays(n, dtype, n)[0])  # it did update


def test_a_planted_bug_in_the_adam_source_is_caught():
    good = cuda_sources.SOURCES["adam"]
    planted = good.replace("T mi = b1 * m[i] + one_minus_b1 * gi;", "T mi = b1 * m[i] + one_minus_b2 * gi;")
    assert planted != good
    ours, plain = _adam_arrays(1000, np.float32, 0), _adam_arrays(1000, np.float32, 0)
    with emulated({"adam": planted}):
        adam.adam_update_cuda(*([a] for a in ours), **ADAM_STEP)
    adam_update(*([a] for a in plain), **ADAM_STEP)
    assert not np.array_equal(ours[2], plain[2]) and not np.array_equal(ours[0], plain[0])


def test_emulated_routes_kernel_function_and_restores_it():
    assert cuda_sources.KERNEL_FUNCTION_HOOK is None
    with emulated():
        kernel = cuda_sources.kernel_function("adam", "adam_update_float32")
        assert isinstance(kernel, cuda_emulator.HostKernel) and not kernel.synced
        assert [p.c_type for p in kernel.parameters[:5]] == ["float*"] * 4 + ["long long"]
    assert cuda_sources.KERNEL_FUNCTION_HOOK is None


@pytest.mark.parametrize("threads", [1, 32, 256])
def test_shared_memory_tree_sum_over_several_blocks(threads):
    x = np.arange(1, 5 * threads - 2, dtype=np.float64)  # integers: the sums are exact; the last block partial
    out, expected = _sums(x, threads)
    assert host_kernel("toy", "tree_sum", TOY).synced  # through block_sum: its threads run as fibers
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("planted", ["every __syncthreads", "the loop's __syncthreads"])
def test_a_missing_syncthreads_gives_wrong_sums_at_every_run(planted):
    """Without any __syncthreads the threads run one after another (each reads its neighbours' slots before
    they are written); without the loop's, thread 0 runs the whole loop before thread 8 has added its pair."""
    loop_sync = "if (t < s) buf[t] += buf[t + s];\n        __syncthreads();"
    source = TOY.replace("__syncthreads();", "") if planted.startswith("every") else \
        TOY.replace(loop_sync, "if (t < s) buf[t] += buf[t + s];")
    assert source != TOY
    x = np.arange(1, 3 * 32 + 1, dtype=np.float64)
    for _ in range(3):  # the threads' order is fixed, not an OS scheduler's: wrong at every run, never flaky
        out, expected = _sums(x, 32, source)
        assert not np.array_equal(out, expected)


def test_threads_that_return_early_leave_the_barriers():
    active, blocks = 5, 3
    x = np.arange(active * blocks, dtype=np.int32)
    out = np.zeros(blocks, dtype=np.int32)
    host_kernel("toy", "first_threads_sum", TOY)((blocks,), (64,), (x, np.int32(active), out))
    np.testing.assert_array_equal(out, x.reshape(blocks, active).sum(1))


def test_two_and_three_dimensional_grids_and_blocks():
    width, height = 10, 9
    out = np.full((height, width), -1, dtype=np.int32)
    kernel = host_kernel("toy", "index_map_2d", TOY)
    kernel((3, 2), (4, 5), (out, np.int32(width), np.int32(height)))
    y, x = np.mgrid[:height, :width]
    np.testing.assert_array_equal(out, x + 1000 * y + 1000000 * 32)
    out3 = np.zeros((3, 4, 5), dtype=np.int32)
    host_kernel("toy", "index_map_3d", TOY)((2, 1, 3), (3, 4, 1), (out3, np.int32(5), np.int32(4), np.int32(3)))
    z, y, x = np.mgrid[:3, :4, :5]
    np.testing.assert_array_equal(out3, x + 100 * y + 10000 * z)


def test_the_portable_fibers_run_as_the_fast_ones(monkeypatch):
    """ucontext, what a machine other than x86-64 runs, forced here by a define."""
    monkeypatch.setattr(cuda_emulator, "FLAGS", (*cuda_emulator.FLAGS, "-D__NF_UCONTEXT"))
    source = TOY + "\n// ucontext\n"  # another source: compiled with the define, not found in this process's cache
    x = np.arange(1, 3 * 64 - 5, dtype=np.float64)
    out, expected = _sums(x, 64, source)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("construct, what", [
    ("float y = __shfl_down_sync(0xffffffff, x[0], 1);", "warp shuffles"),
    ("atomicAdd(x, 1.0f);", "atomics"),
    ("float y = __expf(x[0]);", "approximate"),
    ("float y = rsqrtf(x[0]);", "approximate"),
])
def test_constructs_outside_the_dialect_are_refused_by_name(construct, what):
    source = 'extern "C" __global__ void k(float* x) { %s }' % construct
    with pytest.raises(CudaEmulatorError, match=f"kernel refused uses what the CUDA host emulator does not run: "
                                                f"{what}"):
        host_kernel("refused", "k", source)
    dynamic = 'extern "C" __global__ void k(float* x) { extern __shared__ float s[]; s[0] = x[0]; }'
    with pytest.raises(CudaEmulatorError, match="extern __shared__"):
        host_kernel("refused", "k", dynamic)


def test_arguments_cupy_would_misread_are_refused_naming_the_parameter():
    kernel = host_kernel("adam", "adam_update_float32")
    p, g, m, v = _adam_arrays(10, np.float32, 0)
    n_at = [q.name for q in kernel.parameters].index("n")
    good = [p, g, m, v] + [None] * (len(kernel.parameters) - 4)
    for i, q in enumerate(kernel.parameters[4:], start=4):
        good[i] = np.zeros(2, dtype=q.dtype) if q.pointer else q.dtype(0)

    def call(**changes):
        args = list(good)
        for index, value in changes.items():
            args[int(index[1:])] = value
        kernel((1,), (32,), tuple(args))

    call()  # the well-formed call runs
    with pytest.raises(CudaEmulatorArgumentError, match=r"argument 4 \(long long n\) takes np.int64, got\s+int32"):
        call(**{f"a{n_at}": np.int32(10)})
    with pytest.raises(CudaEmulatorArgumentError, match=r"argument 0 \(float\* p\): the array is not C-contiguous"):
        call(a0=np.zeros(20, dtype=np.float32)[::2])
    with pytest.raises(CudaEmulatorArgumentError, match=r"argument 1 \(float\* g\) points to float32, the array is "
                                                        r"float64"):
        call(a1=g.astype(np.float64))
    last = len(good) - 1
    with pytest.raises(CudaEmulatorArgumentError, match=rf"argument {last} \(int zero_grad\) takes np.int32, got "
                                                        r"a Python bool"):
        call(**{f"a{last}": True})
    with pytest.raises(CudaEmulatorArgumentError, match=rf"takes {len(good)} arguments \(float\* p, float\* g"):
        kernel((1,), (32,), tuple(good[:-1]))
    with pytest.raises(CudaEmulatorArgumentError, match="more than 1024 threads"):
        kernel((1,), (2048,), tuple(good))


def test_without_gpp_the_error_says_so(monkeypatch):
    monkeypatch.setattr(cuda_emulator.shutil, "which", lambda name: None)
    with pytest.raises(CudaEmulatorError, match="needs g\\+\\+"):
        host_kernel("no compiler", "k", 'extern "C" __global__ void k(float* x) { x[0] = 1; }')


def test_a_source_that_does_not_compile_shows_g_plus_plus_log():
    log = r"(?s)kernel broken does not compile as C\+\+.*broken.cu:1:.*undeclared"
    with pytest.raises(CudaEmulatorError, match=log):
        host_kernel("broken", "k", 'extern "C" __global__ void k(float* x) { x[0] = undeclared; }')
