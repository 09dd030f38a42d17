"""Host threads for elementwise work: numpy releases the GIL inside ufuncs and BLAS calls.

Elementwise passes (softmax, LayerNorm, dropout, the loss, Adam) run on one core in
numpy; split into row blocks and handed to a small thread pool, they run on all of
them. Small batched GEMMs (attention's per-head products) run single-threaded inside
OpenBLAS, so splitting the batch over these threads is what puts the second core to
work on them. Every splitter here gives the same result as one call on the whole
arrays (each block does the same arithmetic on its own rows), and falls back to that
one call for small arrays, one thread, or cupy arrays.

Thread count: ``$NUMFORMER_NUM_THREADS``, else ``$OMP_NUM_THREADS``, else the usable
cores; :func:`set_num_threads` changes it.
"""
from __future__ import annotations

import os
import threading

from ... import environment
from ...backend import is_cupy_array

_pool = None
_pool_lock = threading.Lock()
_num_threads = None
PARALLEL_MIN_ELEMENTS = 1 << 17  # below this, splitting costs more than it saves


def get_num_threads() -> int:
    """Threads for host elementwise work: $NUMFORMER_NUM_THREADS, else $OMP_NUM_THREADS, else the usable cores."""
    global _num_threads
    if _num_threads is None:
        _num_threads = environment.num_threads()
        if _num_threads is None:
            try:
                _num_threads = len(os.sched_getaffinity(0))
            except AttributeError:
                _num_threads = os.cpu_count() or 1
    return _num_threads


def set_num_threads(n: int) -> None:
    """Set the thread count of the splitters (1 turns the pool off)."""
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


def _run_groups(run, groups):
    """``run(group)`` for every group, the first on this thread and the rest in the pool; results in order."""
    pool = _get_pool(get_num_threads())
    futures = [pool.submit(run, g) for g in groups[1:]]
    out = run(groups[0])
    for f in futures:
        out.extend(f.result())
    return out


def parallel_rows(fn, *arrays, chunk_elements: int | None = None):
    """Run ``fn(*chunks)`` over row blocks of ``arrays`` (split along axis 0), in threads; list of results.

    ``fn`` must only touch its own rows (it may write them in place) and returns a
    per-block value (e.g. a partial sum) or None. Blocks of about ``chunk_elements``
    elements keep a multi-pass ``fn`` cache-resident. Small arrays, one thread, or
    cupy arrays: one call ``fn(*arrays)``, so the result is the same either way.
    """
    a0 = arrays[0]
    n = a0.shape[0] if a0.ndim else 0
    threads = get_num_threads()
    size = a0.size
    if (is_cupy_array(a0) or n < 2 or (threads < 2 and chunk_elements is None)
            or size < PARALLEL_MIN_ELEMENTS):
        return [fn(*arrays)]
    blocks = max(threads, -(-size // chunk_elements) if chunk_elements else threads)
    blocks = min(blocks, n)
    step = -(-n // blocks)
    bounds = [(i, min(i + step, n)) for i in range(0, n, step)]
    if threads < 2:
        return [fn(*(a[i:j] for a in arrays)) for i, j in bounds]
    # Each worker takes a contiguous run of blocks so consecutive blocks stay on one core.
    per = -(-len(bounds) // threads)
    groups = [bounds[k:k + per] for k in range(0, len(bounds), per)]
    return _run_groups(lambda group: [fn(*(a[i:j] for a in arrays)) for i, j in group], groups)


def parallel_ranges(fn, n: int, work: int, device_array=None):
    """Run ``fn(i, j)`` over ``[0, n)`` cut into contiguous ranges, in host threads; list of results in order.

    For work split along a batch axis where the arrays do not all share it (a mask
    broadcast over the batch): ``fn`` slices what it needs. ``work``: elements
    touched in all (below ``PARALLEL_MIN_ELEMENTS``, one call ``fn(0, n)``).
    With ``device_array`` a cupy array, or one thread: one call, the same result.
    """
    threads = get_num_threads()
    if (n < 2 or threads < 2 or is_cupy_array(device_array)
            or work < PARALLEL_MIN_ELEMENTS):
        return [fn(0, n)]
    parts = min(n, threads)
    bounds = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]
    return _run_groups(lambda group: [fn(i, j) for i, j in group], [[b] for b in bounds])


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
    _run_groups(lambda group: [fn(*t) for t in group] and [], groups)
