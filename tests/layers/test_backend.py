"""The backend: device resolution, dtype policy, lazy cupy, scatter-add, RNG state."""
import builtins
import subprocess
import sys

import numpy as np
import pytest

from numformer import backend


def test_default_device_and_env(monkeypatch):
    monkeypatch.delenv("NUMFORMER_DEVICE", raising=False)
    assert backend.resolve_device() == "cpu"
    monkeypatch.setenv("NUMFORMER_DEVICE", "cuda:1")
    assert backend.resolve_device() == "cuda:1"
    assert backend.resolve_device("cpu") == "cpu"
    with pytest.raises(backend.BackendError, match="unknown device 'tpu'"):
        backend.resolve_device("tpu")


def test_dtypes():
    assert backend.resolve_dtype(None) == np.float32
    assert backend.resolve_dtype("float64") == np.float64
    with pytest.raises(backend.BackendError):
        backend.resolve_dtype("float16")


def test_importing_numformer_does_not_import_cupy():
    code = "import sys, numformer.model, numformer.loss, numformer.optim; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cuda_without_cupy_is_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_cupy(name, *a, **kw):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(backend, "_cupy", None)
    monkeypatch.setattr(builtins, "__import__", no_cupy)
    with pytest.raises(backend.BackendError) as err:
        backend.xp_for("cuda")
    msg = str(err.value)
    assert "cupy" in msg and "--device cpu" in msg and "\n" not in msg


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_scatter_add_matches_add_at(n):
    rng = np.random.default_rng(n)
    target = rng.standard_normal((11, 4))
    expected = target.copy()
    index = rng.integers(0, 11, n)
    values = rng.standard_normal((n, 4))
    np.add.at(expected, index, values)
    backend.scatter_add(target, index, values)
    np.testing.assert_allclose(target, expected, rtol=1e-12, atol=1e-12)


def test_random_state_round_trip():
    rs = backend.RandomState(5)
    state = rs.get_state()
    a = rs.uniform((3, 4), np.float32)
    rs.set_state(state)
    assert np.array_equal(a, rs.uniform((3, 4), np.float32))
    assert not np.array_equal(a, rs.uniform((3, 4), np.float32))


def test_get_array_module_is_numpy_for_numpy():
    assert backend.get_array_module(np.zeros(3)) is np
