"""The thread counts a bench pins before numpy (and torch) are imported: OpenMP, the BLAS libraries and
numformer's host threads (numformer/environment.py reads ``NUMFORMER_NUM_THREADS``)."""
import os

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMFORMER_NUM_THREADS")


def pin_threads(n: int) -> None:
    """Every thread count of :data:`THREAD_VARS` set to ``n`` (0 leaves the environment as it is); call it
    before numpy is imported, which reads them once."""
    if n:
        for var in THREAD_VARS:
            os.environ[var] = str(n)
