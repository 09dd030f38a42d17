"""The cupy branches of numformer only call what cupy has (checked without a GPU).

No GPU is lent to this project's CI, so the cupy path cannot run there. cupy
itself imports without one, though, and knows its own API. Here the array
module every layer asks for (``get_array_module``, ``model.xp``) is replaced by
:class:`CupyShaped`: numpy underneath (so the numbers are computed), but any
attribute that cupy does not have, any ufunc method cupy's ufuncs lack, and
ufunc keywords cupy rejects (``where=``) raise. Because this module is not
``numpy`` itself, every ``xp is np`` test in numformer takes its GPU branch
(cupy's random generator, ``cupyx.scatter_add``, one Adam kernel set per
tensor), so those lines run too. A training step, the loss, clipping, Adam and
both searches go through it.

What this cannot see: differences in behaviour behind the same name, and methods
of the arrays themselves. ``tests/test_gpu.py`` covers those on a real GPU.
"""
import importlib
import pkgutil
import types

import numpy as np
import pytest

import numformer
from numformer import backend

cupy = pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
cupyx = pytest.importorskip("cupyx")

BANNED_UFUNC_KEYWORDS = {"where", "subok", "order"}  # numpy ufunc keywords cupy's ufuncs do not take


class CupyShapedUfunc:
    def __init__(self, np_ufunc, cp_ufunc, name):
        self._np, self._cp, self._name = np_ufunc, cp_ufunc, name

    def _check(self, kwargs):
        bad = BANNED_UFUNC_KEYWORDS & set(kwargs)
        assert not bad, f"cupy.{self._name} takes no {sorted(bad)} keyword"

    def __call__(self, *args, **kwargs):
        self._check(kwargs)
        return self._np(*args, **kwargs)

    def __getattr__(self, name):
        assert hasattr(self._cp, name), f"cupy.{self._name} has no .{name}"
        method = getattr(self._np, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            self._check(kwargs)
            return method(*args, **kwargs)
        return call


class CupyShaped:
    """numpy, lending only the names its cupy counterpart also has."""

    def __init__(self, np_mod=np, cp_mod=cupy, path="cupy"):
        self._np, self._cp, self._path = np_mod, cp_mod, path
        self.used = set()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        assert hasattr(self._cp, name), f"{self._path}.{name} does not exist in cupy {cupy.__version__}"
        value = getattr(self._np, name)
        self.used.add(f"{self._path}.{name}")
        if isinstance(value, types.ModuleType):
            return CupyShaped(value, getattr(self._cp, name), f"{self._path}.{name}")
        if isinstance(value, np.ufunc):
            return CupyShapedUfunc(value, getattr(self._cp, name), name)
        return value


SCATTER_CALLS = []


def scatter_add(target, index, values):
    """What ``cupyx.scatter_add`` does (atomic adds), on numpy."""
    SCATTER_CALLS.append(index.size)
    np.add.at(target, index, values)


def test_fake_catches_a_missing_name():
    xp = CupyShaped()
    with pytest.raises(AssertionError, match="does not exist in cupy"):
        xp.nanargmin_made_up_name  # noqa: B018
    with pytest.raises(AssertionError, match="where"):
        xp.exp(np.ones(2), where=np.ones(2, bool))
    assert xp.exp(np.zeros(1))[0] == 1.0


def test_gpu_branches_use_only_cupy_api(monkeypatch):
    from numformer.decode import beam_search, greedy_search
    from numformer.loss import LabelSmoothedCrossEntropy
    from numformer.model import Transformer
    from numformer.optim import Adam, NoamSchedule, clip_grad_norm
    from numformer.presets import get_preset

    xp = CupyShaped()
    original, patched = backend.get_array_module, []
    for info in pkgutil.walk_packages(numformer.__path__, "numformer."):
        mod = importlib.import_module(info.name)
        if getattr(mod, "get_array_module", None) is original:
            monkeypatch.setattr(mod, "get_array_module", lambda *arrays: xp)
            patched.append(info.name)
    monkeypatch.setattr(cupyx, "scatter_add", scatter_add)
    assert "numformer.layers.attention" in patched and "numformer.optim" in patched

    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2)
    model = Transformer(cfg, seed=0).to(xp)
    assert model.xp is xp and model.rng.xp is xp  # the GPU generator branch
    opt = Adam(model.parameters(), schedule=NoamSchedule(16, warmup=10))
    crit = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    src = np.array([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])
    before = model.src_embed.weight.data.copy()

    for _ in range(2):
        logits = model(src, tgt[:, :-1])
        loss = crit.forward(logits, tgt[:, 1:])
        model.backward(crit.backward())
        clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    assert np.isfinite(float(loss))
    assert SCATTER_CALLS, "the embedding backward did not take the cupyx.scatter_add branch"
    assert not np.array_equal(before, model.src_embed.weight.data)
    model.eval()
    greedy_search(model, src, max_len_a=1, max_len_b=5, bos_id=2, eos_id=3)
    beam_search(model, src, beam=3, max_len_a=1, max_len_b=5, bos_id=2, eos_id=3)
    assert {"cupy.matmul", "cupy.random", "cupy.sqrt"} <= xp.used
