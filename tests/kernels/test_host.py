"""numformer/kernels/host/: OpenBLAS's thread timeout is set for training, before numpy loads, and only then (each
case in a fresh interpreter, since the point is what happens before numpy is imported); the thread pool's
splitters give what one call on the whole arrays gives, with 2 and 3 threads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.kernels.host import threads as kthreads
from support import threads  # noqa: F401  (the host thread count, a fixture)

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "NUMFORMER_BLAS_TUNE")}
    env.update(env_changes)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


REPORT = "import os; print(tuned, os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"


@pytest.mark.parametrize("before, env, expected", [
    ("", {}, "True 5"),                                              # fresh process: set
    ("import numpy; ", {}, "False None"),                            # numpy already loaded: too late, left alone
    ("", {"NUMFORMER_BLAS_TUNE": "0"}, "False None"),                # opted out
    ("", {"OPENBLAS_THREAD_TIMEOUT": "12"}, "False 12"),             # the user's value is kept
])
def test_tune_blas_threads_only_before_numpy_and_never_over_the_user(before, env, expected):
    code = before + "from numformer.kernels.host.blas_threads import tune_blas_threads; tuned = tune_blas_threads(); " + REPORT
    assert run_python(code, **env) == expected


def test_train_py_sets_the_timeout_before_numpy_loads_and_translate_py_does_not():
    """train.py tunes before its numformer imports pull in numpy; translate.py (decoding) keeps the spin."""
    template = ("import os, runpy, sys\n"
                "sys.argv = [{script!r}, '--help']\n"
                "try:\n    runpy.run_path({script!r}, run_name='__main__')\n"
                "except SystemExit:\n    pass\n"
                "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), 'numpy' in sys.modules)\n")
    out_train = run_python(template.format(script=str(ROOT / "train.py")))
    out_translate = run_python(template.format(script=str(ROOT / "translate.py")))
    assert out_train.splitlines()[-1] == "5 True"
    assert out_translate.splitlines()[-1] == "None True"


# -- the host thread pool's splitters: each gives what one call on the whole arrays gives ----------------
def test_parallel_rows_matches_one_call(threads):
    x = np.random.default_rng(0).standard_normal((1000, 300))
    out = np.empty_like(x)

    def f(xb, ob):
        np.exp(xb, out=ob)
        return ob.sum()

    parts = kthreads.parallel_rows(f, x, out, chunk_elements=10_000)
    np.testing.assert_allclose(out, np.exp(x))
    assert sum(parts) == pytest.approx(np.exp(x).sum())
    assert len(kthreads.parallel_rows(lambda a: a.shape, x[:3])) == 1  # small inputs: one call


def test_parallel_ranges_cover_once(threads):
    hits = np.zeros(37, dtype=int)

    def f(i, j):
        hits[i:j] += 1
        return j - i

    parts = kthreads.parallel_ranges(f, 37, work=10**9)
    assert (hits == 1).all() and sum(parts) == 37
    assert kthreads.parallel_ranges(lambda i, j: (i, j), 37, work=10) == [(0, 37)]


def test_parallel_tasks_runs_every_task_once(threads):
    hits = np.zeros(50, dtype=int)
    kthreads.parallel_tasks(lambda i: hits.__setitem__(i, hits[i] + 1), [(i,) for i in range(50)],
                            sizes=range(1, 51))
    assert (hits == 1).all()
