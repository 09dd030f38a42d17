"""Shared pytest set-up: the ``gpu`` marker skips without cupy and a CUDA device; the worst errors
the tolerance-based suites measured are printed at the end of the run (tests/worst_error.py); the
session-wide run folders of tests/support.py (a trained copy run, a random-weight run) are fixtures of
every test file. Test files live in subject folders and import helpers from tests/ (on the path here).

The README's test command runs two pytest-xdist workers (``-n 2`` in pyproject.toml), one per core: most tests
are single-threaded Python, and one process left a core idle for a third of the suite. Each worker then gets one
OpenBLAS thread (unless the environment sets one, as tests/cpu_matrix.py's rows do): two workers of two
spinning BLAS threads each on two cores made small GEMMs 10-30x slower (tests/marian_files.py)."""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # before numpy is imported in this process
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest  # noqa: E402

from support import copy_run, cuda_available, random_run, run_copy  # noqa: F401, E402  (shared fixtures)
from worst_error import CACHE_KEY, WORST, record_worst, summary_lines  # noqa: E402
import process_state  # noqa: E402


@pytest.fixture(autouse=True)
def process_state_put_back():
    """Every test leaves the worker's process-wide settings as it found them (tests/process_state.py says why)."""
    before = process_state.snapshot()
    yield
    changed = process_state.changes(before, process_state.snapshot())
    if changed:
        pytest.fail("this test changed process-wide state that later in-process runs of this worker would "
                    "inherit; put it back (monkeypatch, a context manager or try/finally):\n" + "\n".join(changed))


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs cupy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    for line in summary_lines():
        terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand its worst errors to the controller (pytest_testnodedown)
        workeroutput["worst_error"] = dict(WORST)
        return
    cache = getattr(session.config, "cache", None)
    if cache is not None and WORST:
        cache.set(CACHE_KEY, {k: {"value": v, "where": w} for k, (v, w) in WORST.items()})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under xdist (the controller): each worker's worst errors merged into this process's table."""
    for key, (value, where) in getattr(node, "workeroutput", {}).get("worst_error", {}).items():
        record_worst(key, value, where)
