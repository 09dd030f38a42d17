"""On a GPU (``pytest -m gpu``): each CUDA kernel (numformer/kernels/cuda_sources.py) computes its plain twin's
floats, bit for bit, at the kernel sizes, and a planted bug in its source is caught. Passing here at a source's
hash is what numformer/kernels/cuda_proofs.json records (the kernel then runs by default)."""
import numpy as np
import pytest

from numformer.backend import to_host
from numformer.kernels import adam, cuda_sources
from numformer.optim import adam_update

pytestmark = pytest.mark.gpu

SIZES = (1, 255, 257, 1 << 20, 52_000_000)  # an element, around one block, a megabyte, base's buffer


def _state(cp, n, dtype, seed):
    rng = np.random.default_rng(seed)
    p, g, m = (cp.asarray(rng.standard_normal(n).astype(dtype)) for _ in range(3))
    v = cp.asarray(rng.random(n).astype(dtype))
    return [p], [g], [m], [v]


def _step(update, state, zero_grad):
    update(*state, 1e-3 / (1 - 0.9 ** 7), 0.9, 0.98, (1 - 0.98 ** 7) ** 0.5, 1e-9, zero_grad)
    return [to_host(a[0]) for a in state]


@pytest.mark.parametrize("zero_grad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
def test_fused_adam_is_the_plain_math_bit_for_bit(n, dtype, zero_grad, monkeypatch):
    import cupy as cp
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    plain = _step(adam_update, _state(cp, n, dtype, 0), zero_grad)
    fused = _step(adam.adam_update_cuda, _state(cp, n, dtype, 0), zero_grad)
    for a, b in zip(plain, fused):
        assert np.array_equal(a, b)


def test_a_planted_bug_is_caught(monkeypatch):
    """(1 - b2) for (1 - b1) in the first moment: the comparison above fails."""
    import cupy as cp
    monkeypatch.setitem(cuda_sources.SOURCES, "adam", cuda_sources.SOURCES["adam"].replace(
        "T mi = b1 * m[i] + one_minus_b1 * gi;", "T mi = b1 * m[i] + one_minus_b2 * gi;"))
    monkeypatch.setattr(cuda_sources, "_MODULES", {})
    plain = _step(adam_update, _state(cp, 4096, np.float32, 1), False)
    fused = _step(adam.adam_update_cuda, _state(cp, 4096, np.float32, 1), False)
    assert not np.array_equal(plain[0], fused[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_norm_is_the_float64_norm_and_flags_overflow(dtype, monkeypatch):
    """Base's buffer and two small arrays: the two-launch norm against the float64 norm; an inf sets the flag,
    and the fused Adam given that flag leaves the weights and moments as they were."""
    import cupy as cp
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    rng = np.random.default_rng(5)
    host = [rng.standard_normal(n).astype(dtype) for n in (52_000_000, 17, 4096)]
    grads = [cp.asarray(g) for g in host]
    flag = cp.zeros(1, dtype=np.int32)
    norm = float(adam.grad_norm_cuda(grads, nonfinite=flag))
    exact = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in host)))
    assert abs(norm - exact) <= 1e-12 * exact and int(flag[0]) == 0
    grads[1][3] = np.inf
    assert not np.isfinite(float(adam.grad_norm_cuda(grads, nonfinite=flag))) and int(flag[0]) == 1
    state = _state(cp, 4096, dtype, 6)
    before = [to_host(a[0]) for a in state]
    adam.adam_update_cuda(*state, *(1e-3, 0.9, 0.98, 0.5, 1e-9), True, skip=flag)
    assert np.array_equal(to_host(state[0][0]), before[0]) and np.array_equal(to_host(state[2][0]), before[2])
    assert not to_host(state[1][0]).any()
