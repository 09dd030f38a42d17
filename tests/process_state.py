"""What one test can leave behind in a pytest worker that changes another test's in-process run.

Tests call ``train.main`` and the layers in the worker's own process, next to subprocess runs of the same
command (tests/training/test_faults.py compares an in-process reference run with runs resumed after a kill
in a fresh process, bit for bit). A test that changes process-wide state and does not put it back (the kernel
mode, the kernel files left out, the matmul precision, the host thread count, a variable of the environment
numformer or a BLAS reads, numpy's error handling, a signal handler) makes every later in-process run of that
worker compute something else than a fresh process: which later test then fails depends on how xdist
shared the files out, not on the code. tests/conftest.py takes :func:`snapshot` before and after every test
and fails the test that changed it, naming what changed.
"""
from __future__ import annotations

import os
import signal

import numpy as np

# Variables read once per process by numformer, OpenBLAS, OpenMP, MKL or cupy.
ENVIRONMENT_PREFIXES = ("NUMFORMER_", "OMP_", "OPENBLAS_", "MKL_", "CUPY_", "GOTO_")
SIGNALS = [s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]


def snapshot() -> dict:
    """The process-wide settings that change the arithmetic or the behaviour of a later in-process run."""
    from numformer import kernels, precision  # noqa: PLC0415  (after conftest set the BLAS variables)
    from numformer.kernels.host import threads  # noqa: PLC0415

    return {
        "kernel mode (numformer.kernels.use_kernels)": kernels.get_kernels(),
        "kernel files left out (numformer.kernels.set_disabled)": sorted(kernels.disabled()),
        "matmul precision (numformer.precision.set_matmul_precision)": precision.get_matmul_precision(),
        "host threads (numformer.kernels.host.threads.set_num_threads)": threads.get_num_threads(),
        "environment": {k: v for k, v in os.environ.items() if k.startswith(ENVIRONMENT_PREFIXES)},
        "numpy error handling (np.seterr)": np.geterr(),
        "signal handlers": {s: signal.getsignal(getattr(signal, s)) for s in SIGNALS},
    }


def changes(before: dict, after: dict) -> list[str]:
    """One line per setting that differs: its name, then what it was and what it is now."""
    return [f"{key}: {before[key]!r} -> {after[key]!r}" for key in before if before[key] != after[key]]
