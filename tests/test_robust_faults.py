"""Crash faults: SIGKILL at any moment (between steps, mid-step, mid-checkpoint-write) leaves the previous
checkpoint loadable and --resume ends with the same parameters, bit for bit, as an uninterrupted run;
SIGINT and SIGTERM save a checkpoint of the current step and exit cleanly (130, no traceback)."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from numformer.checkpoint import load_checkpoint  # noqa: E402

STEPS = 40


def args(out, steps=STEPS, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "10", "--eval-every", "0", "--no-test", "--log-every", "5", "--max-tokens", "800", *extra]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted reference run: 40 steps, checkpoints every 10."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert train.main(args(out)) == 0
    return out


def ckpts(run):
    return sorted((Path(run) / "checkpoints").glob("step_*.npz"))


def metrics(run):
    recs = []
    for line in (Path(run) / "metrics.jsonl").read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            pass
    return recs


def assert_same_run(a, b, step=STEPS):
    ca = load_checkpoint(Path(a) / "checkpoints" / f"step_{step:07d}.npz")
    cb = load_checkpoint(Path(b) / "checkpoints" / f"step_{step:07d}.npz")
    assert ca.model.keys() == cb.model.keys()
    for name in ca.model:
        assert np.array_equal(ca.model[name], cb.model[name]), name
    assert ca.optimizer["step_count"] == cb.optimizer["step_count"] == step
    for x, y in zip(ca.optimizer["m"] + ca.optimizer["v"], cb.optimizer["m"] + cb.optimizer["v"]):
        assert np.array_equal(x, y)
    assert ca.meta["rng"] == cb.meta["rng"]
    assert (ca.meta["epoch"], ca.meta["batch_pos"]) == (cb.meta["epoch"], cb.meta["batch_pos"])
    curve = lambda run: [(r["step"], r["train_loss"]) for r in metrics(run) if "train_loss" in r]  # noqa: E731
    assert curve(a) == curve(b)
    assert len(curve(a)) == step // 5


def wait_for(proc, condition, timeout=120.0):
    """Poll until condition() holds; fails if the process ends first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"training ended (status {proc.returncode}) before the moment to interrupt it:\n{err[-2000:]}")
        time.sleep(0.005)
    proc.kill()
    pytest.fail("timed out waiting for the training process")


def past_a_checkpoint(run):
    """True once a checkpoint exists and the metrics show a later step (training has moved past it)."""
    def check():
        found = ckpts(run)
        if not found or not (Path(run) / "metrics.jsonl").exists():
            return False
        saved = int(found[-1].stem.split("_")[1])
        return any(r.get("step", 0) > saved for r in metrics(run))
    return check


def resume(run, capsys=None):
    assert train.main(args(run) + ["--resume"]) == 0


def test_sigkill_at_a_random_moment_loses_nothing(whole, tmp_path):
    """Plain `python train.py`, killed with SIGKILL once it has a checkpoint and has trained past it."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args(run)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(proc, past_a_checkpoint(run))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    newest = ckpts(run)[-1]
    step = load_checkpoint(newest).optimizer["step_count"]  # the newest checkpoint loads
    assert 10 <= step < STEPS
    resume(run)
    assert_same_run(whole, run)


# Runs train.main with a trap: at the chosen moment the process writes a marker file and waits to be killed.
TRAPPED = r"""
import os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
import train
from numformer import optim
moment, marker = {moment!r}, {marker!r}

def wait_to_be_killed(note=""):
    with open(marker + ".tmp", "w") as f:
        f.write(note)
    os.replace(marker + ".tmp", marker)
    while True:
        time.sleep(1)

if moment == "mid-step":
    # Inside the 25th update, half-way: forward and backward done, about half of the parameters updated
    # in place, the others not yet. Reached through public names only (Adam.step, Parameter.data): when
    # the 25th step starts, every parameter's array is swapped for a view of the same memory that sees
    # in-place ufunc writes into it (out=, -=, ...; however the update is organised: blocks, threads,
    # kernels); once half of the parameters have been written, every thread that writes stops there.
    # The marker says how many parameters had changed at that moment.
    import threading
    lock, written, tripped = threading.Lock(), set(), []

    class Watched(np.ndarray):
        def __array_finalize__(self, obj):
            self.index = getattr(obj, "index", None)

        def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kw):
            plain = lambda a: a.view(np.ndarray) if isinstance(a, Watched) else a
            targets = [a for a in (out or ()) if isinstance(a, Watched)]
            if targets and tripped:
                wait_forever()
            if out is not None:
                kw["out"] = tuple(plain(a) for a in out)
            result = getattr(ufunc, method)(*(plain(a) for a in inputs), **kw)
            if targets:
                with lock:
                    written.update(a.index for a in targets)
                    trip = not tripped and len(written) >= len(params) // 2
                    if trip:
                        tripped.append(True)
                if trip:
                    changed = sum(not np.array_equal(p.data.view(np.ndarray), s) for p, s in zip(params, before))
                    wait_to_be_killed(f"{{changed}} {{len(params)}}")
                elif tripped:
                    wait_forever()
            return result

    def wait_forever():
        while True:
            time.sleep(1)

    real_step, params, before = optim.Adam.step, [], []
    def step(self, *a, **k):
        if self.step_count == 24:
            params[:] = list(self.params)
            before[:] = [p.data.copy() for p in params]
            for i, p in enumerate(params):
                w = p.data.view(Watched)
                w.index = i
                p.data = w
        return real_step(self, *a, **k)
    optim.Adam.step = step
elif moment == "mid-write":  # the checkpoint of step 30: half of its bytes are on disk
    import io
    real_savez, calls = np.savez, [0]
    def savez(f, *a, **k):
        calls[0] += 1
        if calls[0] == 3 and hasattr(f, "fileno"):
            buf = io.BytesIO()
            real_savez(buf, *a, **k)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            wait_to_be_killed()
        return real_savez(f, *a, **k)
    np.savez = savez
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("moment", ["mid-step", "mid-write"])
def test_sigkill_mid_step_or_mid_checkpoint_write_loses_nothing(moment, whole, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "trapped"
    code = TRAPPED.format(root=str(ROOT), moment=moment, marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", code, *args(run)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(proc, marker.exists)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if moment == "mid-step":  # killed with some parameters updated and others not
        changed, total = map(int, marker.read_text().split())
        assert 0 < changed < total, (changed, total)
    names = [p.name for p in ckpts(run)]
    assert names == ["step_0000010.npz", "step_0000020.npz"]
    load_checkpoint(ckpts(run)[-1])
    leftovers = list((run / "checkpoints").glob(".step_0000030.npz.*.tmp"))
    assert len(leftovers) == (1 if moment == "mid-write" else 0)  # the half-written file never got the real name
    with open(run / "metrics.jsonl", "a") as f:  # a kill can also cut a metrics line in half
        f.write('{"step": 23, "train_lo')
    resume(run)
    assert not list((run / "checkpoints").glob(".*.tmp"))  # the leftover was cleaned up
    assert_same_run(whole, run)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_saves_the_current_step_and_resume_continues(sig, whole, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args(run, 1000)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(proc, lambda: any(r.get("step", 0) >= 5 for r in metrics(run))
             if (run / "metrics.jsonl").exists() else False)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    stopped = int(out.split("interrupted at step ")[1].split(":")[0])
    assert 5 <= stopped < STEPS, out
    assert f"saved {run / 'checkpoints' / f'step_{stopped:07d}.npz'}; continue with --resume" in out
    ck = load_checkpoint(ckpts(run)[-1])
    assert ck.optimizer["step_count"] == stopped  # a checkpoint at the step where it stopped
    resume(run)
    assert_same_run(whole, run)
