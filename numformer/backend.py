"""Array backend: numpy on the CPU, cupy on NVIDIA GPUs, one code path for both.

Every layer finds its array module from its inputs with :func:`get_array_module`
(Chainer's pattern), so the same ``forward``/``backward`` runs on either device.
cupy is imported only when a CUDA device is asked for, so numformer installs and
runs on machines without it.

Also here: the dtype policy (float32 by default, float64 for gradient checks),
the per-model random generator, host<->device copies, and the one scatter-add
that numpy and cupy spell differently.
"""
from __future__ import annotations

import os
import sys
import threading

import numpy as np

DEFAULT_DTYPE = np.float32
_DTYPES = {"float32": np.float32, "float64": np.float64}

_cupy = None  # the cupy module once a CUDA device has been asked for


class BackendError(RuntimeError):
    """A device or dtype request that cannot be met; the message says what to do."""


def resolve_dtype(dtype) -> np.dtype:
    """'float32' / 'float64' / a numpy dtype -> numpy dtype; anything else is an error."""
    if dtype is None:
        return np.dtype(DEFAULT_DTYPE)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise BackendError(f"unknown dtype {dtype!r}: use float32 or float64") from None
    if dt.name not in _DTYPES:
        raise BackendError(f"unsupported dtype {dt.name}: use float32 or float64")
    return dt


def resolve_device(device: str | None = None) -> str:
    """The device to use: the argument, else $NUMFORMER_DEVICE, else 'cpu'.

    Accepted: 'cpu', 'cuda', 'cuda:N' (also 'gpu' as an alias of 'cuda').
    """
    device = device or os.environ.get("NUMFORMER_DEVICE") or "cpu"
    device = device.strip().lower()
    if device == "gpu":
        device = "cuda"
    if device == "cpu" or device == "cuda":
        return device
    if device.startswith("cuda:") and device[5:].isdigit():
        return device
    raise BackendError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


def import_cupy():
    """Import cupy on first use, checking that a GPU is really there.

    Raises BackendError with a one-line message saying what to install or check.
    """
    global _cupy
    if _cupy is not None:
        return _cupy
    try:
        import cupy  # noqa: PLC0415  (lazy on purpose: cupy is optional)
    except ImportError:
        raise BackendError(
            "device 'cuda' needs cupy: pip install 'numformer[gpu]' (cupy-cuda12x), or use --device cpu"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError when no driver or no GPU
        raise BackendError(f"cupy is installed but no CUDA GPU is usable ({exc}); use --device cpu") from None
    if count < 1:
        raise BackendError("cupy is installed but no CUDA GPU was found; use --device cpu")
    _cupy = cupy
    return cupy


def xp_for(device: str | None):
    """The array module (numpy or cupy) for a device string; selects the GPU for 'cuda:N'."""
    device = resolve_device(device)
    if device == "cpu":
        return np
    cupy = import_cupy()
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= cupy.cuda.runtime.getDeviceCount():
        raise BackendError(f"no GPU {index}: this machine has {cupy.cuda.runtime.getDeviceCount()}")
    cupy.cuda.Device(index).use()
    return cupy


def get_array_module(*arrays):
    """cupy if any argument is a cupy array, numpy otherwise (works without CUDA)."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return np


def is_cupy_array(a) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def to_host(a) -> np.ndarray:
    """A numpy copy-or-view of a numpy or cupy array (checkpoints hold these)."""
    if is_cupy_array(a):
        return a.get()
    return np.asarray(a)


def to_xp(a, xp, dtype=None):
    """Move an array to the array module ``xp`` (numpy or cupy), optionally casting."""
    if xp is np:
        out = to_host(a)
        return out.astype(dtype, copy=False) if dtype is not None else out
    return xp.asarray(a, dtype=dtype)


def scatter_add_rows(target, index, values, scale=None):
    """``target[index[i]] += scale * values[i]`` with repeated indices summed (embedding backward).

    target: (V, d); index: (n,) int; values: (n, d); ``scale`` an optional scalar.
    numpy: the rows are sorted by index; the first row of each distinct index is
    added with one fancy-indexed ``+=`` (indices unique there, so nothing is lost),
    the remaining duplicates with ``np.add.at``. Measured (2,560 rows of 256 into
    8,000): 1.7 ms, against 4.2 ms for ``np.add.at`` alone and 8.3 ms for sort +
    ``np.add.reduceat``. cupy: ``cupyx.scatter_add`` (atomic adds on the GPU).
    """
    xp = get_array_module(target)
    if xp is not np:
        import cupyx  # noqa: PLC0415  (only reached with cupy arrays)

        cupyx.scatter_add(target, index, values if scale is None else values * scale)
        return target
    index = index.ravel()
    n = index.size
    if n == 0:
        return target
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(sorted_index[1:], sorted_index[:-1], out=first[1:])
    rows = values[order]  # a gathered copy: scaling it in place is free of side effects
    if scale is not None:
        rows *= np.asarray(scale, dtype=rows.dtype)
    if first.all():
        target[sorted_index] += rows
        return target
    target[sorted_index[first]] += rows[first]
    rest = ~first
    np.add.at(target, sorted_index[rest], rows[rest])
    return target


DROPOUT_BLOCK = 1 << 15  # elements per block of a host dropout mask (drawn, made and applied in cache)


class RandomState:
    """One seeded generator per model: dropout masks come from here.

    On the CPU it wraps ``numpy.random.Generator`` (PCG64), whose state is a plain
    dict that checkpoints store, so a resumed run draws the same masks.
    On the GPU it wraps ``cupy.random.Generator`` seeded from the same seed.
    """

    def __init__(self, seed: int = 0, xp=np):
        self.seed = int(seed)
        self.xp = xp
        self.generator = xp.random.default_rng(self.seed)

    def to(self, xp) -> "RandomState":
        """Re-home the generator on another array module (state restarts from the seed on a switch)."""
        if xp is not self.xp:
            self.xp = xp
            self.generator = xp.random.default_rng(self.seed)
        return self

    def uniform(self, shape, dtype):
        """Uniform [0, 1) samples of ``shape`` on this generator's device."""
        return self.generator.random(shape, dtype=dtype)

    def dropout_mask(self, shape, p: float, dtype, then=None):
        """Inverted-dropout mask of ``shape``: ``1/(1 - p')`` where kept, 0 where dropped.

        On the CPU each element draws 16 random bits and is dropped when they fall
        below ``round(p * 65536)``: the drop probability is ``p' = round(p * 65536) / 65536``
        (within 2**-17 of ``p``; 0.1 -> 0.100006) and the scale uses ``p'``, so the
        expectation is exact. The bits are those of one ``random_raw(ceil(n / 4))`` call
        (four uint16 per 64-bit word), but the host threads draw them in parallel, each
        from a copy of the generator advanced to its share (``PCG64.advance``): the mask
        is the same for any thread count, and the generator ends where that one call
        would leave it. These are the bits the earlier ``integers(0, 65536, dtype=uint16)``
        draw gave (numpy splits each 64-bit word into the same four, low half first), so
        masks, and runs, are bit for bit those of before for shapes with a multiple of 4
        elements. ``then(lo, hi, block)``, if given, is called with consecutive
        flat ranges ``[lo, hi)`` of the mask (about ``DROPOUT_BLOCK`` elements) in the
        thread that made them, while they are in cache: Dropout applies the mask there.
        Measured (2,560 x 256, 2 threads): 0.54 ms against 0.75 ms for one
        ``integers(0, 65536, dtype=uint16)`` call, before the fused apply.
        On the GPU: uniform float draws compared to ``p``; ``then`` is not supported.
        """
        if self.xp is np:
            n = int(np.prod(shape, dtype=np.int64))
            threshold = int(round(p * 65536))
            scale = np.asarray(65536.0 / (65536 - threshold), dtype=dtype)
            mask = np.empty(n, dtype=dtype)
            bit_gen = self.generator.bit_generator
            start = bit_gen.state
            words = -(-n // 4)
            bit_gen.advance(words)
            block_words = DROPOUT_BLOCK // 4

            def fill(w0, w1):
                gen = type(bit_gen)(0)
                gen.state = start
                gen.advance(w0)
                for b0 in range(w0, w1, block_words):  # cache-sized blocks, in order
                    b1 = min(b0 + block_words, w1)
                    lo, hi = 4 * b0, min(4 * b1, n)
                    block = mask[lo:hi]
                    # bool x scale -> float in one pass (no astype copy then a second scaling pass)
                    np.multiply(gen.random_raw(b1 - b0).view(np.uint16)[: hi - lo] >= threshold, scale, out=block)
                    if then is not None:
                        then(lo, hi, block)

            parallel_ranges(fill, words, n)
            return mask.reshape(shape)
        if then is not None:
            raise ValueError("dropout_mask(then=...) is a host-only fusion")
        mask = (self.generator.random(shape, dtype=dtype) >= p).astype(dtype)
        mask *= 1.0 / (1.0 - p)
        return mask

    def get_state(self) -> dict:
        if self.xp is np:
            return {"seed": self.seed, "bit_generator": self.generator.bit_generator.state}
        return {"seed": self.seed}

    def set_state(self, state: dict) -> None:
        self.seed = int(state["seed"])
        if self.xp is np and "bit_generator" in state:
            self.generator.bit_generator.state = state["bit_generator"]
        else:
            self.generator = self.xp.random.default_rng(self.seed)


# -- host speed helpers -------------------------------------------------------------
def tune_allocator() -> bool:
    """Keep freed large blocks in glibc's heap instead of returning them to the OS.

    By default glibc serves every block above a (dynamic, at most 32 MB) threshold
    with a fresh ``mmap`` and unmaps it on free, so each large numpy temporary of a
    training step (activations, the (tokens, vocab) logits) is page-faulted and
    zeroed by the kernel again on every step. Raising the mmap and trim thresholds
    lets those blocks be reused: measured -15% to -20% step time on the CPU presets.
    Process-wide; called once when numformer.backend is imported unless
    ``NUMFORMER_MALLOC_TUNE=0``. A no-op (returns False) off glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # noqa: PLC0415

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1
        if not ok:  # older glibc caps the mmap threshold at 32 MB
            ok = libc.mallopt(m_mmap_threshold, 32 << 20) == 1
        return bool(libc.mallopt(m_trim_threshold, 1 << 30) == 1 and ok)
    except (OSError, AttributeError):
        return False


ALLOCATOR_TUNED = tune_allocator() if os.environ.get("NUMFORMER_MALLOC_TUNE", "1") != "0" else False

_pool = None
_pool_lock = threading.Lock()
_num_threads = None
PARALLEL_MIN_ELEMENTS = 1 << 17  # below this, splitting costs more than it saves


def get_num_threads() -> int:
    """Threads for host elementwise work: $NUMFORMER_NUM_THREADS, else $OMP_NUM_THREADS, else the usable cores."""
    global _num_threads
    if _num_threads is None:
        env = os.environ.get("NUMFORMER_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        if env and env.isdigit() and int(env) > 0:
            _num_threads = int(env)
        else:
            try:
                _num_threads = len(os.sched_getaffinity(0))
            except AttributeError:
                _num_threads = os.cpu_count() or 1
    return _num_threads


def set_num_threads(n: int) -> None:
    """Set the thread count of :func:`parallel_rows` (1 turns the pool off)."""
    global _num_threads, _pool
    with _pool_lock:
        _num_threads = max(int(n), 1)
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def _get_pool(n: int):
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

                _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="numformer")
    return _pool


def parallel_rows(fn, *arrays, min_elements: int | None = None, chunk_elements: int | None = None):
    """Run ``fn(*chunks)`` over row blocks of ``arrays`` (split along axis 0), in threads; list of results.

    numpy releases the GIL inside ufuncs, so elementwise work on separate row
    blocks runs on separate cores. ``fn`` must only touch its own rows (it may
    write them in place) and returns a per-block value (e.g. a partial sum) or
    None. Blocks of about ``chunk_elements`` elements keep a multi-pass ``fn``
    cache-resident. Small arrays, one thread, or cupy arrays (the GPU runs its
    own kernels): one call ``fn(*arrays)``, so the result is the same either way.
    """
    a0 = arrays[0]
    n = a0.shape[0] if a0.ndim else 0
    threads = get_num_threads()
    size = a0.size
    if (is_cupy_array(a0) or n < 2 or (threads < 2 and chunk_elements is None)
            or size < (PARALLEL_MIN_ELEMENTS if min_elements is None else min_elements)):
        return [fn(*arrays)]
    blocks = max(threads, -(-size // chunk_elements) if chunk_elements else threads)
    blocks = min(blocks, n)
    step = -(-n // blocks)
    bounds = [(i, min(i + step, n)) for i in range(0, n, step)]
    if threads < 2:
        return [fn(*(a[i:j] for a in arrays)) for i, j in bounds]
    pool = _get_pool(threads)
    # Each worker takes a contiguous run of blocks so consecutive blocks stay on one core.
    per = -(-len(bounds) // threads)
    groups = [bounds[k:k + per] for k in range(0, len(bounds), per)]

    def run(group):
        return [fn(*(a[i:j] for a in arrays)) for i, j in group]

    futures = [pool.submit(run, g) for g in groups[1:]]
    out = run(groups[0])
    for f in futures:
        out.extend(f.result())
    return out


def parallel_ranges(fn, n: int, work: int, device_array=None, blocks_per_thread: int = 1,
                    min_work: int | None = None):
    """Run ``fn(i, j)`` over ``[0, n)`` cut into contiguous ranges, in host threads; list of results in order.

    For work split along a batch axis where the arrays do not all share it (a mask
    broadcast over the batch): ``fn`` slices what it needs. ``work``: elements
    touched in all (below ``PARALLEL_MIN_ELEMENTS`` or ``min_work``, one call ``fn(0, n)``).
    With ``device_array`` a cupy array, or one thread: one call, the same result.
    Small batched GEMMs (attention) run single-threaded inside OpenBLAS, so this is
    what puts the second core to work on them.
    """
    threads = get_num_threads()
    if (n < 2 or threads < 2 or is_cupy_array(device_array)
            or work < (PARALLEL_MIN_ELEMENTS if min_work is None else min_work)):
        return [fn(0, n)]
    parts = min(n, threads * max(int(blocks_per_thread), 1))
    bounds = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]
    per = -(-len(bounds) // threads)
    groups = [bounds[k:k + per] for k in range(0, len(bounds), per)]

    def run(group):
        return [fn(i, j) for i, j in group]

    pool = _get_pool(threads)
    futures = [pool.submit(run, g) for g in groups[1:]]
    out = run(groups[0])
    for f in futures:
        out.extend(f.result())
    return out


def parallel_tasks(fn, tasks, sizes=None):
    """Run ``fn(*task)`` for every task tuple, spread over the host threads; returns None.

    Tasks are split into one contiguous run per thread, balanced by ``sizes``
    (work per task, e.g. element counts). Serial with one thread or cupy arrays.
    """
    tasks = list(tasks)
    threads = get_num_threads()
    if threads < 2 or len(tasks) < 2 or is_cupy_array(tasks[0][0]):
        for t in tasks:
            fn(*t)
        return
    sizes = [1] * len(tasks) if sizes is None else list(sizes)
    total = sum(sizes)
    groups, cur, acc, k = [], [], 0, 1
    for t, n in zip(tasks, sizes):
        cur.append(t)
        acc += n
        if acc >= total * k / threads and k < threads:
            groups.append(cur)
            cur, k = [], k + 1
    if cur:
        groups.append(cur)

    def run(group):
        for t in group:
            fn(*t)

    pool = _get_pool(threads)
    futures = [pool.submit(run, g) for g in groups[1:]]
    run(groups[0])
    for f in futures:
        f.result()


def describe(xp) -> str:
    """A one-line description of the array module and its BLAS/GPU, for logs and benchmarks."""
    if xp is np:
        return f"numpy {np.__version__} (python {sys.version.split()[0]})"
    dev = xp.cuda.Device()
    name = xp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return f"cupy {xp.__version__} on {name}"
