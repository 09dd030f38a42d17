"""No module under numformer/ does array math with numpy behind the backend's back on the device path.

If a layer called ``np.exp(x)`` instead of ``xp.exp(x)``, it would work on the
CPU and fail (or silently copy to the host) on cupy. Two checks:

* at run time, the model lives on the CuPy stand-in (``tests/cupy_standin.py``: numpy
  arrays that numformer takes for device arrays, so the device branches run, not the
  host fast paths), every numformer module's ``np`` is swapped for a guard that only
  hands out dtypes, and a full training step, clipping, Adam, the loss and both
  searches run: any ``np.<function>`` call on the device path raises, and so does any
  numpy function applied to a device array (``np.asarray(x)`` included) in any module;
* statically, no module does ``from numpy import ...`` (which the guard cannot see).

The host fast paths (threads, fused blocks) use numpy on purpose and are not checked
here; they are checked equal to the plain math by their own tests.
"""
import ast
import importlib
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import numformer

pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
pytest.importorskip("cupyx")

import cupy_standin as cs  # noqa: E402

HOST_ONLY = {
    # modules that work on host numpy arrays by design
    "numformer.backend",      # the one place that picks numpy or cupy
    "numformer.finite_differences",    # float64 finite differences on the host (the package and its modules)
    "numformer.presets",      # no arrays
    "numformer.checkpoint",   # checkpoints are host numpy by contract (the package and its modules)
}


def host_only(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HOST_ONLY)
ALLOWED_ATTRS = {"float16", "float32", "float64", "int32", "int64", "bool_", "dtype", "ndarray", "integer", "floating"}


class NumpyGuard:
    """Stands in for ``np`` in a module: dtypes are fine, any function is an error."""

    def __init__(self, module_name):
        self.module_name = module_name

    def __getattr__(self, name):
        if name in ALLOWED_ATTRS:
            return getattr(np, name)
        raise AssertionError(f"{self.module_name} calls np.{name} in the hot path: use the backend's xp")


def numformer_modules():
    for info in pkgutil.walk_packages(numformer.__path__, "numformer."):
        if info.name.startswith("numformer.data"):
            continue  # data preparation is host-side text processing
        yield importlib.import_module(info.name)


def test_hot_path_uses_only_the_backend(monkeypatch):
    from numformer.decoding.search import beam_search, greedy_search
    from numformer.loss import LabelSmoothedCrossEntropy
    from numformer.model import Transformer
    from numformer.optim import Adam, NoamSchedule, clip_grad_norm
    from numformer.presets import get_preset

    xp = cs.install(monkeypatch)
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2), seed=0).to(xp)
    opt = Adam(model.parameters(), schedule=NoamSchedule(16, warmup=10))
    crit = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    src = np.array([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])

    guarded = []
    for mod in numformer_modules():
        if not host_only(mod.__name__) and getattr(mod, "np", None) is np:
            monkeypatch.setattr(mod, "np", NumpyGuard(mod.__name__))
            guarded.append(mod.__name__)
    assert "numformer.layers.attention" in guarded and "numformer.model" in guarded

    logits = model(src, tgt[:, :-1])
    crit.forward(logits, tgt[:, 1:])
    model.backward(crit.backward())
    clip_grad_norm(model.parameters(), 1.0)
    opt.step()
    assert cs.SCATTER_CALLS and model.xp is xp  # the device branches ran
    model.eval()
    greedy_search(model, src, max_len_a=1, max_len_b=5, bos_id=2, eos_id=3)
    beam_search(model, src, beam=3, max_len_a=1, max_len_b=5, bos_id=2, eos_id=3)


def test_no_from_numpy_imports():
    root = Path(numformer.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "numpy":
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


def test_device_grad_checks_use_only_the_backend(monkeypatch):
    """bench/gpu_grad_checks.py's runner on the stand-in, with the checks' own helpers guarded as numformer's
    modules are above: the held pad row of the Marian cases (grad_checks/case_helpers.py) once applied
    ``np.asarray`` to the device's ids, which the first GPU run refused (implicit conversion to numpy)."""
    from grad_checks import case_helpers
    from grad_checks.cases import build_cases
    from support import load_file_module

    runner = load_file_module(Path(__file__).parents[2] / "bench" / "gpu_grad_checks.py", "gpu_grad_checks")
    cases = build_cases(["Embedding", "Marian"])  # built on the host, as the runner does (Marian: the whole model)
    xp = cs.install(monkeypatch)
    monkeypatch.setattr(case_helpers, "np", NumpyGuard(case_helpers.__name__))
    results = [r for case in cases for r in runner.check_case(case, xp, np.random.default_rng(0))]
    assert results and all(r["passed"] for r in results), [r for r in results if not r["passed"]]
