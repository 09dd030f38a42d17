"""A CuPy stand-in for machines without a GPU: numpy arrays that numformer takes for device arrays.

No GPU is lent to CI, so the cupy path cannot run there. cupy itself imports without
one and knows its own API, so this helper builds a stand-in that

* is installed as ``numformer.backend._cupy`` (:func:`install`), the module numformer
  uses once a CUDA device was asked for; its ``ndarray`` is :class:`DeviceArray`, a numpy
  subclass. ``get_array_module(a)`` then returns the stand-in and ``is_cupy_array(a)`` is
  True for those arrays, so every device-only branch of numformer runs (``xp is np`` is
  False, ``to_host`` calls ``.get()``, the embedding backward calls ``cupyx.scatter_add``,
  the RNG is ``xp.random.default_rng``'s, the host thread pool is skipped);
* lends only the names that cupy has (module functions, submodules, ufunc methods,
  array methods), and refuses ufunc keywords cupy's ufuncs reject (``where=``):
  a call cupy would not understand fails here too;
* refuses a host (plain numpy) array of one or more dimensions as an operand of a
  device ufunc or function, as cupy does (``TypeError: Unsupported type``): a mask or an
  index left on the host would fail on a GPU and fails here;
* counts every read of a device value back to the host (:data:`READS`): ``float()``,
  ``int()``, ``bool()``, ``operator.index()``, ``.item()``, ``.tolist()``, ``.get()``
  and printing. On a GPU each of these waits for the device (a sync). Copies to the
  device (``xp.asarray`` of a host array) are counted apart (:data:`UPLOADS`): they do
  not wait for queued device work.

Numbers are computed by numpy, so results can be compared with the host path.
What it cannot see: behaviour that differs behind the same name (cupy's dtype
promotion rules, its random streams), speed, and CUDA errors; ``tests/device/test_gpu.py``
(``pytest -m gpu``) covers those on a real GPU.
"""
from __future__ import annotations

import collections
import types

import numpy as np

import cupy  # noqa: F401  (the tests importorskip cupy before importing this module)

CUPY_GENERATOR = cupy.random.Generator  # resolved now: cupy.random loads it lazily

READS = collections.Counter()    # kind of host read -> count (reset with reset_counts())
UPLOADS = collections.Counter()  # host -> device copies by function name
USED = set()                     # "cupy.<name>" of every module attribute handed out
SCATTER_CALLS = []               # index sizes of cupyx.scatter_add calls

BANNED_UFUNC_KEYWORDS = {"where", "subok", "order"}  # numpy ufunc keywords cupy's ufuncs do not take
HOST_INPUT_OK = {"asarray", "array", "asanyarray", "ascontiguousarray"}  # cupy's host -> device copies


def reset_counts() -> None:
    READS.clear()
    UPLOADS.clear()


def _is_host_array(a) -> bool:
    return type(a) is np.ndarray and a.ndim > 0


def _check_operands(name, args, kwargs):
    for a in list(args) + list(kwargs.values()):
        items = a if isinstance(a, (tuple, list)) else (a,)
        for x in items:
            if _is_host_array(x):
                raise TypeError(f"cupy.{name} got a host numpy array {x.shape}: cupy refuses it "
                                "(move it with xp.asarray first)")


def _count_host_keys(key):
    for x in key if isinstance(key, tuple) else (key,):
        if _is_host_array(x):
            UPLOADS["index"] += 1


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def to_device(r):
    """numpy results -> DeviceArray (0-d arrays for scalars, as cupy returns them)."""
    if isinstance(r, DeviceArray):
        return r
    if isinstance(r, np.ndarray):
        return r.view(DeviceArray)
    if isinstance(r, np.generic):
        return np.asarray(r).view(DeviceArray)
    if isinstance(r, tuple):
        return tuple(to_device(x) for x in r)
    if isinstance(r, list) and r and all(isinstance(x, np.ndarray) for x in r):
        return [to_device(x) for x in r]
    return r


class DeviceArray(np.ndarray):
    """A numpy array that numformer takes for a cupy array; host reads are counted."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if kwargs.get("where", None) is True:  # numpy's own methods (a.sum()) pass the default
            del kwargs["where"]
        if kwargs.get("subok", None) is False:  # numpy's a.mean() divides with subok=False (cupy's mean is its own)
            del kwargs["subok"]
        bad = BANNED_UFUNC_KEYWORDS & set(kwargs)
        if bad:
            raise AssertionError(f"cupy.{ufunc.__name__} takes no {sorted(bad)} keyword")
        if method != "__call__" and not hasattr(getattr(cupy, ufunc.__name__, None), method):
            raise AssertionError(f"cupy.{ufunc.__name__} has no .{method}")
        out = kwargs.get("out")
        _check_operands(ufunc.__name__, inputs, {"out": out} if out else {})
        args = [_plain(a) for a in inputs]
        if out:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out:
            return out[0] if len(out) == 1 else out
        return to_device(result)

    # Indexing with, or assigning, a host array: cupy copies it to the device (counted as an upload).
    def __getitem__(self, key):
        _count_host_keys(key)
        return to_device(super().__getitem__(key))

    def __setitem__(self, key, value):
        _count_host_keys(key)
        _count_host_keys(value)
        super().__setitem__(key, value)

    def __getattribute__(self, name):
        if not name.startswith("_") and not hasattr(cupy.ndarray, name):
            raise AssertionError(f"cupy.ndarray has no .{name}")
        return super().__getattribute__(name)

    # -- reads back to the host (each one a device sync on a GPU) --------------------------
    def __float__(self):
        READS["float"] += 1
        return float(self.view(np.ndarray))

    def __int__(self):
        READS["int"] += 1
        return int(self.view(np.ndarray))

    def __bool__(self):
        READS["bool"] += 1
        return bool(self.view(np.ndarray))

    def __index__(self):
        READS["index"] += 1
        return operator_index(self.view(np.ndarray))

    def item(self, *args):
        READS["item"] += 1
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        READS["tolist"] += 1
        return self.view(np.ndarray).tolist()

    def get(self, stream=None, order="C", out=None, blocking=True):
        """cupy's device -> host copy."""
        READS["get"] += 1
        return np.array(self.view(np.ndarray), order=order)

    def __repr__(self):
        READS["print"] += 1
        return "DeviceArray(" + repr(self.view(np.ndarray)) + ")"

    __str__ = __repr__

    def __format__(self, spec):
        READS["print"] += 1
        return format(self.view(np.ndarray)[()] if self.ndim == 0 else self.view(np.ndarray), spec)

    def __array_function__(self, func, types_, args, kwargs):
        # numpy functions applied to device arrays behind the backend's back (np.foo(device)):
        # cupy arrays refuse them (implicit conversion to numpy), so does the stand-in
        raise TypeError(f"numpy.{func.__name__} called on a device array: use the backend's xp")


def operator_index(a):
    import operator  # noqa: PLC0415

    return operator.index(a)


class _UfuncStandin:
    def __init__(self, np_ufunc, cp_ufunc, name):
        self._np, self._cp, self._name = np_ufunc, cp_ufunc, name

    def _check(self, args, kwargs):
        bad = BANNED_UFUNC_KEYWORDS & set(kwargs)
        assert not bad, f"cupy.{self._name} takes no {sorted(bad)} keyword"
        _check_operands(self._name, args, kwargs)

    def __call__(self, *args, **kwargs):
        self._check(args, kwargs)
        return _call(self._np, args, kwargs)

    def __getattr__(self, name):
        assert hasattr(self._cp, name), f"cupy.{self._name} has no .{name}"
        method = getattr(self._np, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            self._check(args, kwargs)
            return _call(method, args, kwargs)
        return call


def _call(fn, args, kwargs):
    """Call a numpy function on plain views of device arrays; device results; ``out=`` kept."""
    out = kwargs.get("out")
    args = [_plain(a) if not isinstance(a, (tuple, list)) else type(a)(_plain(x) for x in a) for a in args]
    kwargs = {k: (_plain(v) if not isinstance(v, tuple) else tuple(_plain(x) for x in v)) for k, v in kwargs.items()}
    result = fn(*args, **kwargs)
    if out is not None:
        return out
    return to_device(result)


class _GeneratorStandin:
    """cupy.random.Generator: numpy's generator underneath, device arrays out."""

    def __init__(self, gen):
        self._gen = gen

    def __getattr__(self, name):
        assert hasattr(CUPY_GENERATOR, name), f"cupy.random.Generator has no .{name}"
        value = getattr(self._gen, name)
        if not callable(value):
            return value
        return lambda *a, **k: to_device(value(*a, **k))


class CupyStandin:
    """numpy, lending only the names its cupy counterpart also has; array results are DeviceArrays."""

    ndarray = DeviceArray

    def __init__(self, np_mod=np, cp_mod=cupy, path="cupy"):
        self._np, self._cp, self._path = np_mod, cp_mod, path
        self.__version__ = f"{cupy.__version__} (numpy stand-in)"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        assert hasattr(self._cp, name), f"{self._path}.{name} does not exist in cupy {cupy.__version__}"
        value = getattr(self._np, name)
        USED.add(f"{self._path}.{name}")
        if isinstance(value, types.ModuleType):
            return CupyStandin(value, getattr(self._cp, name), f"{self._path}.{name}")
        if isinstance(value, np.ufunc):
            return _UfuncStandin(value, getattr(self._cp, name), name)
        if isinstance(value, type) or not callable(value):
            return value  # dtypes and constants (float32, inf, newaxis)
        if name == "default_rng":
            return lambda seed=None: _GeneratorStandin(np.random.default_rng(seed))
        if name in HOST_INPUT_OK:
            def upload(a, *args, **kwargs):
                if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
                    UPLOADS[name] += 1
                return _call(value, (a,) + args, kwargs)
            return upload

        def call(*args, **kwargs):
            _check_operands(name, args, kwargs)
            return _call(value, args, kwargs)
        return call


def scatter_add(target, index, values):
    """What ``cupyx.scatter_add`` does (atomic adds), on numpy; device operands only."""
    _check_operands("scatter_add", (target, index, values), {})
    SCATTER_CALLS.append(int(np.size(_plain(index))))
    np.add.at(_plain(target), _plain(index), _plain(values))


def install(monkeypatch) -> CupyStandin:
    """Make numformer's backend take the stand-in for cupy (undone by pytest after the test)."""
    import cupyx  # noqa: PLC0415

    from numformer import backend  # noqa: PLC0415

    xp = CupyStandin()
    monkeypatch.setattr(backend, "_cupy", xp)
    monkeypatch.setattr(cupyx, "scatter_add", scatter_add)
    reset_counts()
    USED.clear()
    SCATTER_CALLS.clear()
    return xp
