"""Training: let OpenBLAS's worker threads sleep soon after a GEMM, so numformer's own threads get the cores.

OpenBLAS (the BLAS inside numpy's wheels) keeps each worker thread spinning
(``sched_yield`` in a loop) for ``2**28`` cycles, about a tenth of a second,
after every threaded call, waiting for the next one. A training step alternates
GEMMs with elementwise work (softmax, LayerNorm, dropout, the loss, Adam) that
:func:`numformer.kernels.host.threads.parallel_rows` splits over its own threads: while the
BLAS threads spin they take half of every core those threads run on.
``OPENBLAS_THREAD_TIMEOUT=n`` shortens the spin to ``2**n`` cycles before the
thread sleeps; waking it for the next GEMM costs tens of microseconds
(measured here: a GEMV 17 -> 74 us), small against a training step's GEMMs.

Measured on the 2-core machine of the README, 2 threads, steps of
``bench/train_step.py``'s shapes, default against 5, alternated runs:
small 760-790 ms -> 660-720 ms, base 2170-2200 ms -> 2110-2140 ms.
Timeouts of 4 to 12 measured alike; 5 is in the middle of that range.

Decoding is the other way round: its GEMMs are small and back to back, and
waking the sleeping threads for each costs more than the spin (greedy
decoding of the small model, 2 threads: 76 -> 70 sentences/s). So this is
not done for every process: ``train.py`` and the training benchmarks call
:func:`numformer.kernels.host.tune_host` first thing, ``translate.py`` calls it with ``blas=False``.

OpenBLAS reads the variable once, when it loads (when numpy is first
imported), so the call only takes effect before numpy is imported; in a
script of your own, call it before ``import numpy`` or set the variable in
the shell. A value the user set is kept; ``NUMFORMER_BLAS_TUNE=0`` leaves the
environment alone.
"""
from __future__ import annotations

import sys

from ... import environment

BLAS_THREAD_TIMEOUT = "5"  # OpenBLAS clamps to 4..30: spin 2**5 = 32 cycles, then sleep


def tune_blas_threads() -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` unless numpy is already loaded or the user chose; True if set here."""
    try:
        wanted = environment.host_tuning_wanted("blas")
    except environment.EnvironmentVariableError:  # called at import, before the front: the front refuses it
        return False
    if not wanted or "numpy" in sys.modules:
        return False
    return environment.set_blas_thread_timeout(BLAS_THREAD_TIMEOUT)

