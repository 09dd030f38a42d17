"""A run folder belongs to one process (numformer/training/run_lock.py): a second train.py on a folder in use, with
or without --resume, however close in time to the first, says in one line which process holds it and
since when, exits 2 and touches nothing; a lock left by a killed process never blocks the next run.
(MPI ranks of one run share rank 0's lock: tests/training/test_distributed.py.)"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numformer.checkpoint import load_checkpoint
from numformer.run_file_names import LOCK as LOCK_FILE
from numformer.training.run_lock import RunFolderInUse, lock_run_folder, read_holder

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), NUMFORMER_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def train_cmd(out, steps, *extra):
    return [sys.executable, str(ROOT / "train.py"), "--task", "copy", "--preset", "tiny", "--max-steps", str(steps),
            "--out", str(out), "--save-every", "5", "--eval-every", "0", "--no-test", "--log-every", "1",
            "--max-tokens", "400", "--average-last", "1", "--vocab-size", "64", "--no-progress", *extra]


def start(cmd):
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave a training behind
        proc.communicate()
        raise
    return proc.returncode, out, err


def refused(code, err, holder_pid):
    """The second process's ending: exit 2, one line naming the holder's process id and since when."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("train.py: error: ") and "Traceback" not in err
    assert f"is in use by process {holder_pid} " in lines[0] and " since 20" in lines[0], lines[0]


def snapshot(folder):
    """Every file under ``folder``: size, modification time and a hash of its bytes."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def logged_steps(folder):
    return [json.loads(ln)["step"] for ln in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def wait_for(proc, condition, timeout=240.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_two_runs_started_together_one_trains_the_other_exits_2(tmp_path):
    out = tmp_path / "run"
    a, b = start(train_cmd(out, 12)), start(train_cmd(out, 12))  # started within a millisecond
    (code_a, _, err_a), (code_b, _, err_b) = finish(a), finish(b)
    winner, (code, err) = (a, (code_b, err_b)) if code_a == 0 else (b, (code_a, err_a))
    assert winner.returncode == 0, (code_a, err_a, code_b, err_b)
    refused(code, err, winner.pid)
    assert logged_steps(out) == list(range(1, 13))  # one run's metrics, each step once
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000005.npz", "step_0000010.npz",
                                                                      "step_0000012.npz"]
    assert load_checkpoint(out / "checkpoints" / "step_0000012.npz").optimizer["step_count"] == 12
    assert not (out / "crash.log").exists()


def test_a_resume_during_training_exits_2_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    first = start(train_cmd(out, 100000))
    try:
        wait_for(first, lambda: (out / "checkpoints" / "step_0000005.npz").exists())
        first.send_signal(signal.SIGSTOP)  # hold the folder still while the second process tries it
        before = snapshot(out)
        code, _, err = finish(start([sys.executable, str(ROOT / "train.py"), "--out", str(out), "--resume",
                                     "--no-progress"]))
        refused(code, err, first.pid)
        assert snapshot(out) == before
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGINT)  # a clean stop: the step is saved, exit 130
        code, _, err = finish(first)
        assert code == 130, err
    finally:
        if first.poll() is None:
            first.kill()
    steps = logged_steps(out)
    assert steps == list(range(1, steps[-1] + 1))
    assert load_checkpoint(sorted((out / "checkpoints").glob("step_*.npz"))[-1]).optimizer["step_count"] == steps[-1]
    # the first run has ended: its folder is free again, and --resume continues it
    code, stdout, err = finish(start([sys.executable, str(ROOT / "train.py"), "--out", str(out), "--resume",
                                      "--max-steps", str(steps[-1] + 1), "--no-progress"]))
    assert code == 0 and f"resumed from step_{steps[-1]:07d}.npz" in stdout, err


HOLD = ("import sys, time; from numformer.training.run_lock import lock_run_folder; lock = lock_run_folder(sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)")


def hold_in_another_process(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_left_by_a_killed_process_blocks_nobody(tmp_path):
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(RunFolderInUse, match=f"in use by process {holder.pid} "):
            lock_run_folder(tmp_path)
    finally:
        holder.kill()  # SIGKILL: no clean-up of any kind
        holder.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid  # its file stays behind
    lock = lock_run_folder(tmp_path)
    assert lock.held and read_holder(tmp_path)["pid"] == os.getpid()
    lock.release()


def test_one_process_takes_a_folder_once_and_frees_it_on_release(tmp_path):
    lock = lock_run_folder(tmp_path)
    assert lock_run_folder(tmp_path) is lock  # this process's own folder: not a conflict
    lock.release()
    holder = hold_in_another_process(tmp_path)  # released: another process takes it
    try:
        with pytest.raises(RunFolderInUse):
            lock_run_folder(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_a_refused_process_waits_for_the_new_holder_to_name_itself(tmp_path):
    """Between taking the lock and writing its identity, the file may still name a killed holder: the
    refused process does not report that dead process but the live one, once it has written."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename,
                                                  "since": "2000-01-01 00:00:00", "command": "killed"}))
    holder = hold_in_another_process(tmp_path / "other")  # a live process that has written its identity
    try:
        live = (tmp_path / "other" / LOCK_FILE).read_text()
        assert read_holder(tmp_path, wait_s=0.2)["command"] == "killed"  # nothing better came: the stale one
        import threading  # noqa: PLC0415

        threading.Timer(0.3, lambda: (tmp_path / LOCK_FILE).write_text(live)).start()
        assert read_holder(tmp_path, wait_s=5.0)["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
