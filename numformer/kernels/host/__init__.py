"""The host process: the thread pool that kernels split work over, and process-wide tunings.

Not math and not kernels: ``threads`` (the pool of host threads and the row/range/task splitters
that :mod:`numformer.kernels` use; ``NUMFORMER_NUM_THREADS``), ``allocator`` (glibc keeps large freed
blocks) and ``blas_threads`` (OpenBLAS's worker threads sleep soon after a GEMM). Nothing is tuned on
import: the command lines call :func:`tune_host` first thing (``train.py`` and the training benchmarks
before numpy loads, with the BLAS tuning; ``translate.py`` without it). ``NUMFORMER_KERNELS=plain``
skips both tunings, so the plain math runs on an untuned process. Importing this package imports no
numpy: the BLAS tuning must be made before numpy loads.
"""
from __future__ import annotations


def tune_host(blas: bool = True) -> dict:
    """The process-wide tunings: glibc's allocator, and OpenBLAS's thread spin unless ``blas`` is False
    (decoding: see :mod:`.blas_threads`). Call it before numpy is imported. Returns what was done."""
    from .allocator import tune_allocator_if_wanted  # noqa: PLC0415  (imports no numpy)
    from .blas_threads import tune_blas_threads  # noqa: PLC0415

    return {"blas": tune_blas_threads() if blas else False, "allocator": tune_allocator_if_wanted()}
