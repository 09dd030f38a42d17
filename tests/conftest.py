"""Shared pytest set-up: the ``gpu`` marker skips without cupy and a CUDA device; the worst errors
the tolerance-based suites measured are printed at the end of the run (tests/worst_error.py); the
session-wide run folders of tests/support.py (a trained copy run, a random-weight run) are fixtures of
every test file. Test files live in subject folders and import helpers from tests/ (on the path here)."""
import pytest

from support import copy_run, cuda_available, random_run, run_copy  # noqa: F401  (shared fixtures)
from worst_error import CACHE_KEY, WORST, summary_lines


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
    cache = getattr(session.config, "cache", None)
    if cache is not None and WORST:
        cache.set(CACHE_KEY, {k: {"value": v, "where": w} for k, (v, w) in WORST.items()})
