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
