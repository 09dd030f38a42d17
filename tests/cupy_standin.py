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
  not wait for queued device work;
* counts kernel launches by name (:data:`LAUNCHES`): one per ufunc call or reduction, per array method or
  function that writes or makes an array (a view is none, ``empty`` is none, ``zeros`` one), per fused kernel
  launch of the host emulator (``numformer.kernels.cuda_emulator``, by ``kernel:function``), per cuBLAS call
  (CuPy's ``@`` counts its copies of non-contiguous operands of more than two axes and the GEMM, as
  ``cupy/_core/_routines_linalg.pyx`` makes them); the CPU's proxy for the host's share of a GPU step;
* models a CUDA stream capture as CuPy 14 does (``cupy.cuda.Stream``, ``begin_capture``, ``end_capture``,
  ``Graph.launch``; cupy/cupy ``cupy/cuda/stream.pyx``, ``cupy/cuda/graph.pyx``): while the current stream
  captures, every launch is recorded and :meth:`_Graph.launch` replays the records on the same memory, with the
  host values of the capture baked in, as a CUDA graph does; and it refuses what CuPy refuses, with CuPy's own
  exception and message:

  - a cuBLAS call through CuPy (``@``, ``matmul``, ``dot``, ``tensordot``, ``einsum``...):
    ``NotImplementedError: calling cuBLAS API during stream capture is currently unsupported``
    (``cupy_backends/cuda/libs/cublas.pyx``, ``setStream``; CuPy's ``test_stream_capture_failure_cublas``);
  - cuRAND (``cupy.random``'s legacy functions): ``NotImplementedError: calling cuRAND API during stream capture
    is currently unsupported`` (``cupy_backends/cuda/libs/curand.pyx``, ``setStream``);
  - a synchronize (a stream's, an event's, the device's), a device-to-host copy (``float``, ``bool``, ``.get``,
    ``.item``, printing...), ``where`` with one argument, ``nonzero``, ``argwhere``, ``flatnonzero`` and boolean
    masks (CuPy reads the count back to size its result, ``cupy/_core/_routines_indexing.pyx``):
    ``CUDARuntimeError: cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing``,
    which also invalidates the capture (``end_capture`` then raises ``cudaErrorStreamCaptureInvalidated``:
    CuPy's ``test_stream_capture_failure1``, ``_helper4``, ``test_stream_capture_failure3``);

  and two things CuPy does not refuse but gets wrong, refused here with a message of the stand-in's own: a
  host-to-device upload of a host array (CuPy stages it in pinned memory and captures the copy from that
  buffer, which it frees and reuses: a replay uploads whatever the buffer then holds), and an allocation made
  outside a memory pool of the capture's own (``cupy.cuda.using_allocator(pool.malloc)``): CuPy's default pool
  would hand the memory a graph replays into to other arrays;
* models the memory pools a capture allocates from (:class:`_MemoryPool`: bytes allocated, ``set_limit``'s cap
  raising CuPy's ``OutOfMemoryError``, and a ``free_all_blocks`` that refuses while a graph captured from the
  pool is alive, since CuPy's would free blocks that graph replays into: ``cupy/cuda/memory.pyx``), counting
  without reuse (an upper bound of what CuPy's free lists hold);
* answers numformer's own cuBLAS handle (:class:`StandinCublas`, ``numformer.kernels.gemm``) as cuBLAS does,
  column-major on host memory from the pointers and leading dimensions the handle passes, and refuses its calls
  under a capture when the handle is not bound to the capturing stream or has no workspace of its own.

Numbers are computed by numpy, so results can be compared with the host path.
What it cannot see: behaviour that differs behind the same name (cupy's dtype
promotion rules, its random streams), speed, and CUDA errors; ``tests/device/test_gpu.py``
(``pytest -m gpu``) covers those on a real GPU.
"""
from __future__ import annotations

import collections
import ctypes
import itertools
import sys
import types
import weakref

import numpy as np

import cupy  # noqa: F401  (the tests importorskip cupy before importing this module)
from cupy.cuda.memory import OutOfMemoryError
from cupy_backends.cuda.api.runtime import CUDARuntimeError

CUPY_GENERATOR = cupy.random.Generator  # resolved now: cupy.random loads it lazily

READS = collections.Counter()    # kind of host read -> count (reset with reset_counts())
UPLOADS = collections.Counter()  # host -> device copies by function name
LAUNCHES = collections.Counter()  # kernel launches by kernel or operation name
USED = set()                     # "cupy.<name>" of every module attribute handed out
SCATTER_CALLS = []               # index sizes of cupyx.scatter_add calls

BANNED_UFUNC_KEYWORDS = {"where", "subok", "order"}  # numpy ufunc keywords cupy's ufuncs do not take
HOST_INPUT_OK = {"asarray", "array", "asanyarray", "ascontiguousarray"}  # cupy's host -> device copies
NO_KERNEL = {"empty", "empty_like"}  # functions that allocate and launch nothing
CUBLAS_FUNCTIONS = {"matmul", "dot", "vdot", "inner", "tensordot", "einsum", "kron"}  # CuPy's cuBLAS routes
SYNCING_FUNCTIONS = {"nonzero", "argwhere", "flatnonzero"}  # CuPy reads their result's size back
WRITE_FIRST = {"copyto", "put", "place", "putmask", "put_along_axis", "fill_diagonal",  # write their first argument
               "fill", "sort", "partition"}  # (functions; array methods: the array itself)

CUBLAS_REFUSED = "calling cuBLAS API during stream capture is currently unsupported"
CURAND_REFUSED = "calling cuRAND API during stream capture is currently unsupported"
CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED, ILLEGAL_STATE = 900, 901, 401  # cudaError_t values
DEVICE_BYTES = 141 << 30  # the stand-in device's memory (an H200's)


def reset_counts() -> None:
    READS.clear()
    UPLOADS.clear()
    LAUNCHES.clear()


# -- streams, captures, graphs -----------------------------------------------------------------------
class _Capture:
    """What one stream's capture has recorded: replays, the arrays they touch, the pools they allocated from."""

    def __init__(self, stream):
        self.stream, self.ops, self.keep, self.pools, self.invalidated = stream, [], [], set(), False
        self.saved = []  # (array, its values before the capture's first write): a capture runs nothing on a GPU

    def put_back(self) -> None:
        """Undo what computing the capture wrote: on a GPU a capture records its work and runs none of it."""
        for a, before in reversed(self.saved):
            np.copyto(a, before)
        self.saved.clear()


class _State:
    streams: list = []     # the current stream is the last
    allocators: list = [None]  # the current allocator (None: CuPy's default pool) is the last
    depth = 0              # > 0 inside a call the stand-in already counts (its inner numpy calls are not launches)


def _capture():
    """The current stream's capture, or None."""
    return _State.streams[-1].capture if _State.streams else None


def _refuse_sync(what: str) -> None:
    """Under a capture: CuPy's error for an operation that waits for the device (and the capture is invalidated)."""
    capture = _capture()
    if capture is not None:
        capture.invalidated = True
        error = CUDARuntimeError(CAPTURE_UNSUPPORTED)
        error.add_note(f"(the CuPy stand-in: {what} inside a stream capture)")
        raise error


def _refuse_cublas(what: str) -> None:
    if _capture() is not None:
        error = NotImplementedError(CUBLAS_REFUSED)
        error.add_note(f"(the CuPy stand-in: {what} inside a stream capture goes through CuPy's cuBLAS wrappers)")
        raise error


def _refuse_upload(what: str, shape) -> None:
    if _capture() is not None:
        raise RuntimeError(f"the CuPy stand-in refuses a host-to-device upload inside a stream capture ({what} of a "
                           f"host array {shape}): CuPy captures the copy from a pinned staging buffer it frees and "
                           "reuses, so a replay would upload whatever that buffer holds then (CuPy raises nothing)")


def _writes(*arrays) -> None:
    """Arrays an operation is about to write in place: under a capture their values are kept, to be put back when
    it ends (the stand-in computes while it records, a GPU only records)."""
    capture = _capture()
    if capture is not None:
        capture.saved.extend((_plain(a), np.array(_plain(a))) for a in arrays if isinstance(a, np.ndarray))


def _launch(name: str, replay=None) -> None:
    """One kernel launch; under a capture its replay is recorded."""
    LAUNCHES[name] += 1
    capture = _capture()
    if capture is not None and replay is not None:
        capture.ops.append(replay)


def _allocated(*arrays) -> None:
    """New device arrays: under a capture they must come from a pool of the capture's own (and stay alive while
    the graph does: the records replay into them)."""
    capture = _capture()
    if capture is None:
        return
    allocator = _State.allocators[-1]
    if allocator is None:
        raise RuntimeError("the CuPy stand-in refuses an allocation from CuPy's default memory pool inside a stream "
                           "capture: its blocks, freed after the capture, would be handed to other arrays while the "
                           "graph still replays into them (use cupy.cuda.using_allocator(pool.malloc) with a pool "
                           "of the graphs' own)")
    for a in arrays:
        allocator(a.nbytes)
        capture.keep.append(a)
    pool = getattr(allocator, "__self__", None)
    if isinstance(pool, _MemoryPool):
        capture.pools.add(pool)


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.ptr = next(_IDS)

    def record(self, stream=None):
        pass

    def synchronize(self):
        _refuse_sync("Event.synchronize()")

    @property
    def done(self):
        _refuse_sync("Event.done")
        return True


_IDS = itertools.count(16)


class _Stream:
    """cupy.cuda.Stream: a pointer, the current-stream stack (``with stream:``) and a capture."""

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else next(_IDS)
        self.device_id = 0
        self.capture = None

    def __enter__(self):
        _State.streams.append(self)
        return self

    def __exit__(self, *exc):
        _State.streams.pop()

    def use(self):
        _State.streams[-1:] = [self]
        return self

    def begin_capture(self, mode=None):
        if self.ptr in (0, 1):
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self.capture is not None:
            raise CUDARuntimeError(ILLEGAL_STATE)
        self.capture = _Capture(self)

    def end_capture(self):
        capture, self.capture = self.capture, None
        if capture is None:
            raise CUDARuntimeError(ILLEGAL_STATE)
        capture.put_back()
        if capture.invalidated:
            raise CUDARuntimeError(CAPTURE_INVALIDATED)
        return _Graph(capture)

    def is_capturing(self):
        return self.capture is not None

    def synchronize(self):
        _refuse_sync("Stream.synchronize()")

    @property
    def done(self):
        _refuse_sync("Stream.done")
        return True

    def record(self, event=None):
        event = _Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    def __repr__(self):
        return f"<stand-in Stream {self.ptr}>"


NULL_STREAM = _Stream(null=True)
_State.streams = [NULL_STREAM]


class _Graph:
    """cupy.cuda.Graph: the records of one capture, replayed in order on the memory they were captured on."""

    def __init__(self, capture):
        self._ops, self._keep = capture.ops, capture.keep
        self.nodes = len(capture.ops)
        for pool in capture.pools:
            pool._graphs.add(self)

    def upload(self, stream=None):
        pass

    def launch(self, stream=None):
        LAUNCHES["graph launch"] += 1
        if _capture() is not None:
            raise RuntimeError("the CuPy stand-in: a graph launched inside another capture")
        _State.depth += 1
        try:
            for op in self._ops:
                op()
        finally:
            _State.depth -= 1


class _MemoryPool:
    """cupy.cuda.MemoryPool as a capture sees it: bytes allocated (never reused here), a limit, and a
    ``free_all_blocks`` that refuses while a graph captured from it lives. ``allocator``: CuPy's ``cudaMalloc``
    stand-in; :data:`DEVICE_BYTES` the device's memory, past which CuPy's pool frees all its free blocks and
    retries (``cupy/cuda/memory.pyx``, ``SingleDeviceMemoryPool._try_malloc``) unless the allocator raises
    something else than CUDA's out-of-memory error."""

    def __init__(self, allocator=None):
        self._allocator, self._total, self._limit = allocator, 0, 0
        self._graphs = weakref.WeakSet()
        self.freed = 0  # free_all_blocks calls that went through

    def malloc(self, size):
        rounded = -(-int(size) // 512) * 512
        if self._limit and self._total + rounded > self._limit:
            raise OutOfMemoryError(rounded, self._total, self._limit)
        if _device_used() + rounded > DEVICE_BYTES:
            if self._allocator is not None:
                self._allocator(rounded)  # numformer's allocator raises its own error: CuPy then frees nothing
            self.free_all_blocks()  # what CuPy does when cudaMalloc fails
            if _device_used() + rounded > DEVICE_BYTES:
                raise OutOfMemoryError(rounded, self._total, self._limit)
        self._total += rounded
        return rounded

    def free_all_blocks(self, stream=None):
        live = [g for g in self._graphs]
        if live:
            raise AssertionError(f"the CuPy stand-in: free_all_blocks() would free the free blocks of a pool that "
                                 f"{len(live)} live CUDA graph(s) replay into (CuPy frees them: the graphs would "
                                 "write into memory handed to others)")
        self._total = 0
        self.freed += 1

    def total_bytes(self):
        return self._total

    used_bytes = total_bytes

    def free_bytes(self):
        return 0

    def set_limit(self, size=None, fraction=None):
        self._limit = int(size if size is not None else (fraction or 0) * DEVICE_BYTES)

    def get_limit(self):
        return self._limit


_POOLS = weakref.WeakSet()


def _device_used() -> int:
    return sum(p._total for p in _POOLS)


def _new_pool(allocator=None):
    pool = _MemoryPool(allocator)
    _POOLS.add(pool)
    return pool


class _UsingAllocator:
    def __init__(self, allocator=None):
        self.allocator = allocator

    def __enter__(self):
        _State.allocators.append(self.allocator)

    def __exit__(self, *exc):
        _State.allocators.pop()


def _device_full(size):
    """CuPy's ``cudaMalloc`` (``cupy.cuda.Memory(size)``, what its ``_malloc`` wraps in a ``MemoryPointer``) as the
    stand-in's pools call it: only when the device is full, so it fails as CUDA does then."""
    raise CUDARuntimeError(2)  # cudaErrorMemoryAllocation


def _device_synchronize():
    _refuse_sync("cupy.cuda.Device().synchronize()")


class _Device:
    def __init__(self, device=0):
        self.id = 0

    def use(self):
        return self

    def synchronize(self):
        _device_synchronize()


def _cuda_module():
    cuda = types.SimpleNamespace()
    cuda.Stream, cuda.Event, cuda.Device = _Stream, _Event, _Device
    cuda.Stream.null = NULL_STREAM
    cuda.MemoryPool = _new_pool
    cuda.using_allocator = _UsingAllocator
    cuda.get_current_stream = lambda device_id=-1: _State.streams[-1]
    cuda.runtime = types.SimpleNamespace(deviceSynchronize=_device_synchronize,
                                         memGetInfo=lambda: (DEVICE_BYTES - _device_used(), DEVICE_BYTES),
                                         CUDARuntimeError=CUDARuntimeError, errorMemoryAllocation=2)
    cuda.memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
    cuda.Memory, cuda.MemoryPointer = _device_full, lambda memory, offset: memory
    return cuda


# -- arrays -----------------------------------------------------------------------------------------
def _is_host_array(a) -> bool:
    return type(a) is np.ndarray and a.ndim > 0


def _check_operands(name, args, kwargs):
    for a in list(args) + list(kwargs.values()):
        items = a if isinstance(a, (tuple, list)) else (a,)
        for x in items:
            if _is_host_array(x):
                raise TypeError(f"cupy.{name} got a host numpy array {x.shape}: cupy refuses it "
                                "(move it with xp.asarray first)")


def _host_keys(key, what: str) -> None:
    for x in key if isinstance(key, tuple) else (key,):
        if _is_host_array(x):
            _refuse_upload(what, x.shape)
            UPLOADS["index"] += 1


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def _plain_all(args):
    return [type(a)(_plain(x) for x in a) if isinstance(a, (tuple, list)) else _plain(a) for a in args]


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


def _arrays_in(values) -> list:
    found = []
    for v in values:
        if isinstance(v, np.ndarray):
            found.append(v)
        elif isinstance(v, (tuple, list)):
            found.extend(x for x in v if isinstance(x, np.ndarray))
    return found


def _finish(name, result, inputs, rerun, wrote=()):
    """After a numpy call standing for a device operation: count its launch and record its replay. ``result``:
    what numpy returned (plain arrays, a tuple of them, a numpy scalar or None); ``rerun()`` computes it again
    from the same operands; ``wrote``: arrays it wrote in place (``out=``). New arrays (sharing no memory with an
    operand) are allocations; a call that makes nothing new and writes nothing (a view) launches nothing."""
    if _State.depth:
        return to_device(result)
    if isinstance(result, np.generic):
        result = np.asarray(result)
    results = result if isinstance(result, tuple) else (result,)
    new = [r for r in results if isinstance(r, np.ndarray)
           and not any(np.may_share_memory(r, a) for a in inputs)]
    if wrote or result is None:
        _launch(name, rerun)
    elif new:
        _allocated(*new)
        if name not in NO_KERNEL:
            def replay():
                again = rerun()
                again = again if isinstance(again, tuple) else (again,)
                for r, g in zip(results, again):
                    if any(r is x for x in new):
                        np.copyto(r, g)
            _launch(name, replay)
    return to_device(result)


def _run(name, fn, args, kwargs, owner=None):
    """Call numpy's ``fn`` on plain views of device arrays, as the device operation ``name``; ``out=`` kept;
    ``owner``: the (plain) array whose method ``fn`` is (a result viewing it is a view)."""
    out = kwargs.get("out")
    pargs = _plain_all(args)
    pkwargs = {k: (tuple(_plain(x) for x in v) if isinstance(v, tuple) else _plain(v)) for k, v in kwargs.items()}

    def rerun():
        return fn(*pargs, **pkwargs)
    if not _State.depth:
        if out is not None:
            _writes(*_arrays_in([pkwargs["out"]]))
        elif name in WRITE_FIRST or name.endswith(".at"):
            _writes(pargs[0])
    _State.depth += 1
    try:
        result = fn(*pargs, **pkwargs)
    finally:
        _State.depth -= 1
    wrote = _arrays_in([pkwargs["out"]]) if out is not None else ()
    inputs = _arrays_in(pargs) + _arrays_in(pkwargs.values()) + ([owner] if owner is not None else [])
    device = _finish(name, result, inputs, rerun, wrote)
    return out if out is not None else device


_OWN = {"get", "item", "tolist", "view"}  # DeviceArray's own methods (reads) and views: never a launch


class DeviceArray(np.ndarray):
    """A numpy array that numformer takes for a cupy array; host reads and launches are counted."""

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
        if ufunc is np.matmul and not _State.depth:
            _refuse_cublas("the matmul operator (@)")
        out = kwargs.get("out")
        _check_operands(ufunc.__name__, inputs, {"out": out} if out else {})
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        result = _run(name, getattr(ufunc, method), inputs, kwargs)
        if ufunc is np.matmul and not _State.depth:
            _count_cupy_matmul(inputs)
        if out:
            return out[0] if len(out) == 1 else out
        return result

    # Indexing with, or assigning, a host array: cupy copies it to the device (counted as an upload).
    def __getitem__(self, key):
        _host_keys(key, "an index")
        for k in key if isinstance(key, tuple) else (key,):
            if isinstance(k, np.ndarray) and k.dtype == np.bool_:
                _refuse_sync("a boolean mask index")
        plain, pkey = self.view(np.ndarray), tuple(_plain_all(key)) if isinstance(key, tuple) else _plain(key)
        return _finish("take", plain[pkey], [plain], lambda: plain[pkey])

    def __setitem__(self, key, value):
        _host_keys(key, "an index")
        _host_keys(value, "an assigned value")
        plain, pkey, pvalue = self.view(np.ndarray), (tuple(_plain_all(key)) if isinstance(key, tuple)
                                                      else _plain(key)), _plain(value)

        def assign():
            plain[pkey] = pvalue
        if not _State.depth:
            _writes(plain)
        assign()
        if not _State.depth:
            _launch("setitem", assign)

    def __getattribute__(self, name):
        if name.startswith("_"):
            return super().__getattribute__(name)
        if not hasattr(cupy.ndarray, name):
            raise AssertionError(f"cupy.ndarray has no .{name}")
        value = super().__getattribute__(name)
        if name in _OWN or not callable(value):
            return value
        if name == "nonzero":
            _refuse_sync("ndarray.nonzero()")
        if name == "dot":
            _refuse_cublas("ndarray.dot")

        def method(*args, **kwargs):
            plain = np.ndarray.view(self, np.ndarray)
            if _State.depth:
                return value(*args, **kwargs)
            if name in WRITE_FIRST:
                _writes(plain)
            return _run(name, getattr(plain, name), args, kwargs, owner=plain)
        return method

    # -- reads back to the host (each one a device sync on a GPU) --------------------------
    def __float__(self):
        _refuse_sync("float() of a device array")
        READS["float"] += 1
        return float(self.view(np.ndarray))

    def __int__(self):
        _refuse_sync("int() of a device array")
        READS["int"] += 1
        return int(self.view(np.ndarray))

    def __bool__(self):
        _refuse_sync("bool() of a device array")
        READS["bool"] += 1
        return bool(self.view(np.ndarray))

    def __index__(self):
        _refuse_sync("operator.index() of a device array")
        READS["index"] += 1
        return operator_index(self.view(np.ndarray))

    def item(self, *args):
        _refuse_sync(".item()")
        READS["item"] += 1
        return self.view(np.ndarray).item(*args)

    def tolist(self):
        _refuse_sync(".tolist()")
        READS["tolist"] += 1
        return self.view(np.ndarray).tolist()

    def get(self, stream=None, order="C", out=None, blocking=True):
        """cupy's device -> host copy."""
        _refuse_sync(".get()")
        READS["get"] += 1
        return np.array(self.view(np.ndarray), order=order)

    def __repr__(self):
        _refuse_sync("printing a device array")
        READS["print"] += 1
        return "DeviceArray(" + repr(self.view(np.ndarray)) + ")"

    __str__ = __repr__

    def __format__(self, spec):
        _refuse_sync("formatting a device array")
        READS["print"] += 1
        return format(self.view(np.ndarray)[()] if self.ndim == 0 else self.view(np.ndarray), spec)

    def __array_function__(self, func, types_, args, kwargs):
        # numpy functions applied to device arrays behind the backend's back (np.foo(device)):
        # cupy arrays refuse them (implicit conversion to numpy), so does the stand-in
        raise TypeError(f"numpy.{func.__name__} called on a device array: use the backend's xp")


def _count_cupy_matmul(inputs) -> None:
    """CuPy's matmul copies each operand of more than two axes that is not C-contiguous before its GEMM
    (``cupy/_core/_routines_linalg.pyx``): counted as copies beside the GEMM itself (counted as ``matmul``)."""
    for a in inputs:
        if isinstance(a, np.ndarray) and a.ndim > 2 and not a.flags.c_contiguous:
            LAUNCHES["matmul operand copy"] += 1


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
        if self._name == "matmul":
            _refuse_cublas("cupy.matmul")

    def __call__(self, *args, **kwargs):
        self._check(args, kwargs)
        return _run(self._name, self._np, args, kwargs)

    def __getattr__(self, name):
        assert hasattr(self._cp, name), f"cupy.{self._name} has no .{name}"
        method = getattr(self._np, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            self._check(args, kwargs)
            return _run(f"{self._name}.{name}", method, args, kwargs)
        return call


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
        if path == "cupy":
            self.cuda = _cuda_module()
            self._default_pool = _new_pool()

    def get_default_memory_pool(self):
        return self._default_pool

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
        if self._path == "cupy.random":
            def curand(*args, **kwargs):
                if _capture() is not None:
                    raise NotImplementedError(CURAND_REFUSED)
                return to_device(value(*args, **kwargs))
            return curand
        if name in HOST_INPUT_OK:
            def upload(a, *args, **kwargs):
                if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray) and a.ndim > 0:
                    _refuse_upload(f"cupy.{name}", a.shape)
                    UPLOADS[name] += 1
                elif isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
                    UPLOADS[name] += 1  # a 0-d host array: CuPy fills the device array with its value
                return _run(name, value, (a,) + args, kwargs)
            return upload

        def call(*args, **kwargs):
            _check_operands(name, args, kwargs)
            if name in CUBLAS_FUNCTIONS:
                _refuse_cublas(f"cupy.{name}")
            if name in SYNCING_FUNCTIONS or (name == "where" and len(args) + len(kwargs) == 1):
                _refuse_sync(f"cupy.{name} with one argument" if name == "where" else f"cupy.{name}")
            return _run(name, value, args, kwargs)
        return call


def scatter_add(target, index, values):
    """What ``cupyx.scatter_add`` does (atomic adds), on numpy; device operands only."""
    _check_operands("scatter_add", (target, index, values), {})
    SCATTER_CALLS.append(int(np.size(_plain(index))))
    t, i, v = _plain(target), _plain(index), _plain(values)
    _writes(t)
    np.add.at(t, i, v)
    _launch("scatter_add", lambda: np.add.at(t, i, v))


# -- numformer's own cuBLAS handle, answered on host memory ------------------------------------------
_C_TYPES = {0: np.float32, 1: np.float64, 2: np.float16}  # cudaDataType: CUDA_R_32F, _64F, _16F
_COMPUTE_SCALARS = {68: np.float32, 77: np.float32, 70: np.float64}  # COMPUTE_32F, _32F_FAST_TF32, _64F


def _host_matrix(ptr: int, dtype, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0):
    """The column-major (rows x cols) matrices at ``ptr`` (leading dimension ``ld``, ``batch`` of them ``stride``
    elements apart) as a numpy view (batch, rows, cols) of host memory."""
    itemsize = np.dtype(dtype).itemsize
    span = ((rows - 1) + (cols - 1) * ld + (batch - 1) * stride + 1) * itemsize
    buffer = (ctypes.c_char * span).from_address(ptr)
    flat = np.frombuffer(buffer, dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, shape=(batch, rows, cols),
                                           strides=(stride * itemsize, itemsize, ld * itemsize))


class StandinCublas:
    """cuBLAS as numformer's own handle calls it (``numformer.kernels.gemm.CublasLibrary``'s methods), on the
    stand-in's host memory: ``C = alpha op(A) op(B) + beta C``, column-major, as cuBLAS defines its GEMMs. The
    product is computed as numpy computes the row-major product the caller asked for, so it equals ``@`` on the
    same operands bit for bit. Under a capture, a call from a handle not bound to the capturing stream (its work
    would run outside the graph) or without a workspace of its own (cuBLAS would allocate its default one while
    the stream captures: the cuBLAS guide's "CUDA Graphs Support") is refused."""

    def __init__(self):
        self.handles = {}  # handle -> {"stream", "workspace"}

    def create(self):
        handle = next(_IDS)
        self.handles[handle] = {"stream": 0, "workspace": None}
        return handle

    def destroy(self, handle):
        self.handles.pop(handle)

    def set_stream(self, handle, stream):
        if _capture() is not None:
            raise AssertionError("the CuPy stand-in: numformer's cuBLAS handle rebound inside a capture (bind it "
                                 "before the capture begins)")
        self.handles[handle] = {"stream": int(stream), "workspace": None}  # cuBLAS resets the workspace here

    def set_workspace(self, handle, workspace, nbytes):
        self.handles[handle]["workspace"] = (int(workspace), int(nbytes))

    def _check(self, handle, name):
        capture = _capture()
        state = self.handles[handle]
        if capture is not None:
            if state["stream"] != capture.stream.ptr:
                raise AssertionError(f"the CuPy stand-in: {name} from numformer's handle bound to stream "
                                     f"{state['stream']} while stream {capture.stream.ptr} captures: the GEMM would "
                                     "run outside the graph")
            if state["workspace"] is None:
                raise AssertionError(f"the CuPy stand-in: {name} under a capture from a handle without a workspace "
                                     "of its own (cublasSetWorkspace after cublasSetStream)")

    def _gemm(self, name, transa, transb, m, n, k, alpha, a, atype, lda, sa, b, btype, ldb, sb, beta, c, ctype,
              ldc, sc, batch, compute):
        self._check_types(atype, btype, ctype, compute)
        dtype, scalar = _C_TYPES[atype], _COMPUTE_SCALARS[compute]
        alpha_v = np.frombuffer((ctypes.c_char * 8).from_address(alpha), dtype=scalar, count=1)[0]
        beta_v = np.frombuffer((ctypes.c_char * 8).from_address(beta), dtype=scalar, count=1)[0]
        assert alpha_v == 1 and beta_v == 0, "numformer's GEMMs are C = A B"
        # op(A) is m x k: A stored (m x k) for N, (k x m) for T; op(B) is k x n likewise
        a_stored = _host_matrix(a, dtype, *((m, k) if transa == 0 else (k, m)), lda, batch, sa)
        b_stored = _host_matrix(b, dtype, *((k, n) if transb == 0 else (n, k)), ldb, batch, sb)
        op_a = a_stored if transa == 0 else a_stored.transpose(0, 2, 1)
        op_b = b_stored if transb == 0 else b_stored.transpose(0, 2, 1)
        c_view = _host_matrix(c, dtype, m, n, ldc, batch, sc)

        def run():
            # C^T = op(B)^T op(A)^T is the caller's row-major product: computed as numpy computes it
            left, right = op_b.transpose(0, 2, 1), op_a.transpose(0, 2, 1)
            if dtype == np.float16:
                with np.errstate(over="ignore", under="ignore"):
                    product = (left.astype(np.float32) @ right.astype(np.float32)).astype(np.float16)
            else:
                product = left @ right if batch > 1 else (left[0] @ right[0])[None]
            c_view[...] = product.transpose(0, 2, 1)
        run()
        _launch(f"cublas {name}", run)

    @staticmethod
    def _check_types(atype, btype, ctype, compute):
        assert atype == btype == ctype and atype in _C_TYPES and compute in _COMPUTE_SCALARS, \
            (atype, btype, ctype, compute)
        assert (_C_TYPES[atype] == np.float64) == (compute == 70), "float64 GEMMs compute in 64F, others in 32F"

    def gemm_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc,
                compute_type, algo):
        self._check(handle, "cublasGemmEx")
        self._gemm("cublasGemmEx", transa, transb, m, n, k, alpha, a, atype, lda, 0, b, btype, ldb, 0, beta, c,
                   ctype, ldc, 0, 1, compute_type)

    def gemm_strided_batched_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, stride_a, b, btype,
                                ldb, stride_b, beta, c, ctype, ldc, stride_c, batch_count, compute_type, algo):
        self._check(handle, "cublasGemmStridedBatchedEx")
        self._gemm("cublasGemmStridedBatchedEx", transa, transb, m, n, k, alpha, a, atype, lda, stride_a, b, btype,
                   ldb, stride_b, beta, c, ctype, ldc, stride_c, batch_count, compute_type)


def _observe_kernel(name, function, run, written=()):
    """The host emulator's launches (numformer.kernels.cuda_emulator): counted, recorded under a capture."""
    _writes(*written)
    run()
    _launch(f"{name}:{function}", run)


def install(monkeypatch) -> CupyStandin:
    """Make numformer's backend take the stand-in for cupy (undone by pytest after the test)."""
    import cupyx  # noqa: PLC0415

    from numformer import backend  # noqa: PLC0415
    from numformer.kernels import cuda_emulator, gemm  # noqa: PLC0415

    monkeypatch.setattr(sys.modules[__name__], "_POOLS", weakref.WeakSet())  # the device's memory: this test's pools
    xp = CupyStandin()
    monkeypatch.setattr(backend, "_cupy", xp)
    monkeypatch.setattr(cupyx, "scatter_add", scatter_add)
    monkeypatch.setattr(gemm, "LIBRARY_FACTORY", lambda xp_: StandinCublas())
    monkeypatch.setattr(cuda_emulator, "LAUNCH_OBSERVER", _observe_kernel)
    monkeypatch.setattr(_State, "streams", [NULL_STREAM])
    monkeypatch.setattr(_State, "allocators", [None])
    reset_counts()
    USED.clear()
    SCATTER_CALLS.clear()
    return xp
