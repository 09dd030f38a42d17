"""The optimizer step's CUDA kernels (numformer/kernels/adam.py: the fused Adam and the gradient norm) run on the
host emulator in CI: Adam equals the plain math bit for bit with its scalars read from device memory, a set
``skip`` flag drops the update and still zeroes the gradients, the norm of several arrays is the float64 norm
and flags inf and nan; a planted bug in each is caught. The same on a GPU: tests/device/test_cuda_kernels.py."""
import numpy as np
import pytest

from numformer.kernels import adam, cuda_sources
from numformer.kernels.cuda_emulator import emulated
from numformer.optim import adam_update

STEP = (1e-3 / (1 - 0.9 ** 7), 0.9, 0.98, (1 - 0.98 ** 7) ** 0.5, 1e-9)


def state(n, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(dtype) for _ in range(3)] + [rng.random(n).astype(dtype)]


def fused(arrays, zero_grad, **kw):
    with emulated():
        adam.adam_update_cuda(*([a] for a in arrays), *STEP, zero_grad, **kw)
    return arrays


@pytest.mark.parametrize("zero_grad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 255, 257, 70_001])
def test_fused_adam_is_the_plain_math_bit_for_bit(n, dtype, zero_grad):
    plain = state(n, dtype, 0)
    adam_update(*([a] for a in plain), *STEP, zero_grad)
    for a, b in zip(plain, fused(state(n, dtype, 0), zero_grad)):
        assert np.array_equal(a, b)


def test_the_step_scalars_come_from_device_memory():
    """A captured step replays with the values written into ``scalars``, whatever the floats it was built with."""
    plain = state(1000, np.float32, 1)
    adam_update(*([a] for a in plain), *STEP)
    scalars = {"float32": adam.step_scalars(np, np.float32, STEP[0], STEP[3])}
    arrays = state(1000, np.float32, 1)
    with emulated():
        adam.adam_update_cuda(*([a] for a in arrays), 0.0, 0.9, 0.98, 1.0, 1e-9, scalars=scalars)
    assert all(np.array_equal(a, b) for a, b in zip(plain, arrays))


def test_a_set_skip_flag_drops_the_update_and_zeroes_the_gradient():
    before = state(3000, np.float32, 2)
    after = fused([a.copy() for a in before], True, skip=np.ones(1, dtype=np.int32))
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[2], before[2])
    assert np.array_equal(after[3], before[3]) and not after[1].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_norm_of_several_arrays_is_the_float64_norm(dtype):
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(n).astype(dtype) * s for n, s in ((300_001, 1.0), (17, 1e3), (4096, 1e-3))]
    flag = np.zeros(1, dtype=np.int32)
    with emulated():
        norm = adam.grad_norm_cuda(grads, nonfinite=flag)
    exact = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))
    assert norm.shape == () and norm.dtype == np.float64
    assert abs(float(norm) - exact) <= 1e-14 * exact
    assert flag[0] == 0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_gradient_sets_the_flag(bad):
    grads = [np.ones(5000, dtype=np.float32), np.ones(10, dtype=np.float32)]
    grads[1][7] = bad
    flag = np.zeros(1, dtype=np.int32)
    with emulated():
        norm = adam.grad_norm_cuda(grads, nonfinite=flag)
    assert not np.isfinite(norm) and flag[0] == 1


def test_planted_bugs_are_caught(monkeypatch):
    """(1 - b2) for (1 - b1) in the first moment; a tree sum that drops its upper half: both differ."""
    source = cuda_sources.SOURCES["adam"]
    monkeypatch.setitem(cuda_sources.SOURCES, "adam", source.replace(
        "T mi = b1 * m[i] + one_minus_b1 * gi;", "T mi = b1 * m[i] + one_minus_b2 * gi;"))
    plain = state(512, np.float32, 4)
    adam_update(*([a] for a in plain), *STEP)
    assert not np.array_equal(plain[0], fused(state(512, np.float32, 4), False)[0])
    monkeypatch.setitem(cuda_sources.SOURCES, "adam", source.replace(
        "if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];",
        "if (threadIdx.x < half / 2) sums[threadIdx.x] += sums[threadIdx.x + half];"))
    grads = [np.ones(10_000, dtype=np.float32)]
    with emulated():
        assert float(adam.grad_norm_cuda(grads)) != pytest.approx(100.0)
