"""Student code under a clock (issue 40; numformer/user_code_clock.py): a student's backward that never returns stops
``python -m grad_checks check FILE`` (and ``exercise --status DIR``, and ``train.py --swap``'s grading) at the
time limit with one line naming the case and the FILE:LINE it was executing, exit status 2, nothing left
running; a right file passes under the default limit; a bad flag of grad_checks' own is one line, no usage
block.

The command runs in a child process with a ``timeout=``: a regression hangs no CI. The child imports grad_checks
from PYTHONPATH when one is set (to run these tests against another checkout), else from this one.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import lab_files
from grad_checks import exercises, lab
from numformer import user_code_clock as clock
from grad_checks.__main__ import main as grad_checks_main
from grad_checks.swap_grading import grade_swap
from numformer.swap import SwapError
from numformer.user_code import load_file

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m grad_checks"


def _grad_checks(*args, cwd, timeout=60):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    return subprocess.run([sys.executable, "-m", "grad_checks", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _looping(folder, body="    while True:\n        pass\n"):
    """my_layernorm.py with ``body`` in place of the stub's raise -> (path, the line the loop starts on)."""
    path = lab.write_exercise("layernorm", str(folder))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    stub = next(i for i, line in enumerate(lines) if line.strip().startswith("raise NotImplementedError("))
    lines[stub:stub + 1] = [body]
    path.write_text("".join(lines), encoding="utf-8")
    return path, stub + 1


def _first_case() -> str:
    ex = exercises.get("layernorm")
    cases = ex.cases(ex.layer_class(ex.target), 0)
    return f"case 1 of {len(cases)} ({cases[0].case})"


def test_check_stops_a_backward_that_never_returns_in_one_line_naming_the_case_and_file_line(tmp_path):
    path, line = _looping(tmp_path)
    start = time.monotonic()
    proc = _grad_checks("check", str(path), "--time-limit", "2", cwd=tmp_path, timeout=30)
    took = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{PROG}: error: {_first_case()} did not return within 2 s: "
                               f"stopped at {path}:{line} in layernorm_backward"), lines[0]
    assert "--time-limit SECONDS" in lines[0]  # what to do
    assert proc.stdout == ""
    assert took < 15, took  # 2 s, Python's and NumPy's start, the reference's cases


def test_a_loop_that_catches_every_exception_still_ends_in_the_same_line(tmp_path):
    path, line = _looping(tmp_path, "    while True:\n        try:\n            sum(range(10 ** 5))\n"
                                    "        except BaseException:\n            pass\n")
    proc = _grad_checks("check", str(path), "--time-limit", "1", cwd=tmp_path, timeout=30)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{PROG}: error: {_first_case()} did not return within 1 s: stopped at {path}:"), \
        lines[0]


def test_a_right_file_passes_under_the_default_limit(tmp_path):
    ex = exercises.get("layernorm")
    path = lab_files.write(ex, ex.target, tmp_path)
    proc = _grad_checks("check", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: EXACT" in proc.stdout and proc.stderr == ""


def test_a_bad_flag_is_one_line_without_a_usage_block(tmp_path):
    proc = _grad_checks("--bogus-flag", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{PROG}: error: unrecognized arguments: --bogus-flag (see {PROG} --help)"
    assert "usage:" not in proc.stderr and proc.stdout == ""


def test_status_stops_at_the_file_that_never_returns_and_leaves_nothing_behind(tmp_path, capsys):
    assert clock.can_stop()  # SIGALRM, the main thread: else the loop below would run forever
    path, line = _looping(tmp_path)
    threads, handler = threading.active_count(), signal.getsignal(signal.SIGALRM)
    status = grad_checks_main(["exercise", "--status", str(tmp_path), "--time-limit", "0.5"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"{_first_case()} did not return within 0.5 s: stopped at {path}:{line} in layernorm_backward" in err
    assert signal.getsignal(signal.SIGALRM) == handler  # the handler put back, no timer left running
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert threading.active_count() == threads


def test_swap_grading_refuses_a_layer_that_never_returns(tmp_path, monkeypatch):
    assert clock.can_stop()
    path, line = _looping(tmp_path)
    monkeypatch.setattr(clock, "DEFAULT_TIME_LIMIT", 0.5)  # train.py has no flag: its grading reads the default
    with pytest.raises(SwapError) as refused:
        grade_swap("LayerNorm", load_file(path).LayerNorm, f"{path}:LayerNorm")
    assert str(refused.value).startswith(f"--swap LayerNorm: {path}:LayerNorm: {_first_case()} did not return "
                                         f"within 0.5 s: stopped at {path}:{line} in layernorm_backward")
