"""Faults during training, and what survives them: SIGKILL at any moment (between steps, mid-step,
mid-checkpoint-write) leaves the previous checkpoint loadable and --resume ends with the same parameters,
bit for bit, as an uninterrupted run; SIGINT, SIGTERM and SIGHUP save a checkpoint of the current step and exit
cleanly (130, 143, 129, no traceback); an unwritable folder or a full disk is reported before the first step, a
disk that fills later keeps the previous checkpoint; non-finite steps are skipped, and a run of them
stops training with the last good checkpoint the newest; over-long training pairs are left out."""
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

import train
from numformer.training import run_folder as run_folder_module
from numformer.training import trainer as trainer_module
from numformer.checkpoint import load_checkpoint
from mpi_worker import TinyVocab, pairs
from numformer.model import Transformer
from numformer.data.prepared_dataset import PreparedData
from numformer.presets import get_preset
from numformer.training.config import TrainConfig
from support import ROOT, as_a_terminal_starts_it, assert_one_line_error, copy_args, resume_args, run_main, write_corpus


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
    # in place, the others not yet. Reached through public names only (Adam.step, Adam.buffer, Parameter.data):
    # when the 25th step starts, the parameter buffer's value array (numformer.parameter_buffer) is swapped
    # for a view of the same memory that sees in-place ufunc writes into it and into its slices (out=, -=,
    # ...; the fast Adam kernel writes the buffer block by block over the threads); once half of the
    # parameters have been written, every thread that writes stops there. The marker says how many
    # parameters had changed at that moment.
    import threading
    lock, written, tripped = threading.Lock(), set(), []

    def touched(a):  # the parameters whose memory the slice a of the buffer covers
        start = (a.__array_interface__["data"][0] - base[0]) // a.itemsize
        end = start + a.size
        return {{i for i, (lo, hi) in enumerate(spans) if lo < end and start < hi}}

    class Watched(np.ndarray):
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
                    written.update(*(touched(a) for a in targets))
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

    real_step, params, before, spans, base = optim.Adam.step, [], [], [], [0]
    def step(self, *a, **k):
        if self.step_count == 24:
            params[:] = list(self.params)
            before[:] = [p.data.copy() for p in params]
            (group,) = self.buffer.groups
            base[0] = group.data.__array_interface__["data"][0]
            spans[:] = [(o, o + p.size) for p, o in zip(group.params, group.offsets)]
            group.data = group.data.view(Watched)  # the same memory: every parameter's view sees the writes
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
    leftovers = list((run / "checkpoints").glob(".step_0000030.npz.numformer-partial-*"))
    assert len(leftovers) == (1 if moment == "mid-write" else 0)  # the half-written file never got the real name
    with open(run / "metrics.jsonl", "a") as f:  # a kill can also cut a metrics line in half
        f.write('{"step": 23, "train_lo')
    resume(run)
    assert not list((run / "checkpoints").glob(".*numformer-partial-*"))  # the leftover was cleaned up
    assert_same_run(whole, run)


@pytest.mark.parametrize("sig, status, what", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                               (signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                               (signal.SIGHUP, 129, "hung up (SIGHUP)")],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_interrupt_saves_the_current_step_and_resume_continues(sig, status, what, whole, tmp_path):
    """Ctrl-C, a scheduler's SIGTERM, a closed terminal's SIGHUP: the current step saved, the shell's status for
    the signal (no averaging or test translation after it), and --resume ends as the uninterrupted run did:
    the same weights and the same train_loss at every logged step (assert_same_run)."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args(run, 1000)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_a_terminal_starts_it)
    wait_for(proc, lambda: any(r.get("step", 0) >= 5 for r in metrics(run))
             if (run / "metrics.jsonl").exists() else False)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, (out, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{what} at step "), err  # the command's one line, on stderr
    stopped = int(lines[0].split(" at step ")[1].split(":")[0])
    assert 5 <= stopped < STEPS, err
    assert lines[0].endswith(f": saved {run / 'checkpoints' / f'step_{stopped:07d}.npz'}; continue with --resume")
    ck = load_checkpoint(ckpts(run)[-1])
    assert ck.optimizer["step_count"] == stopped  # a checkpoint at the step where it stopped
    resume(run)
    assert_same_run(whole, run)


def test_long_training_pairs_are_left_out_and_counted(tmp_path, capsys):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    src = [" ".join(words[: 2 + i % 5]) for i in range(40)]
    src[7] = " ".join(words * 10)  # 100 words: longer than --max-len 20
    folder = write_corpus(tmp_path / "corpus", {"train.src": "\n".join(src) + "\n", "train.tgt": "\n".join(src) + "\n"})
    code, out, err = run_main(train.main, ["--data", str(folder), "--preset", "tiny", "--max-steps", "2",
                                           "--max-len", "20", "--out", str(tmp_path / "run"), "--no-progress",
                                           "--no-test", "--eval-every", "0", "--vocab-size", "64"], capsys)
    assert code == 0, err
    assert "39 pairs" in out and "1 longer than --max-len 20 left out" in out


def test_all_pairs_too_long_is_one_line(tmp_path, capsys):
    line = " ".join(f"w{i}" for i in range(30))
    folder = write_corpus(tmp_path / "corpus", {"train.src": f"{line}\n{line}\n", "train.tgt": f"{line}\n{line}\n"})
    code, _, err = run_main(train.main, ["--data", str(folder), "--preset", "tiny", "--max-steps", "2", "--max-len",
                                         "4", "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", "all 2 training pairs are longer than --max-len 4")


def test_no_validation_or_test_data_still_trains(tmp_path, capsys):
    lines = "\n".join(f"a b c {w}" for w in "d e f g h i j k".split()) + "\n"
    folder = write_corpus(tmp_path / "corpus", {"train.src": lines, "train.tgt": lines, "valid.src": "",
                                                "valid.tgt": "", "test.src": "", "test.tgt": ""})
    code, out, err = run_main(train.main, ["--data", str(folder), "--preset", "tiny", "--max-steps", "4",
                                           "--save-every", "2", "--out", str(tmp_path / "run"), "--no-progress",
                                           "--vocab-size", "64"], capsys)
    assert code == 0, err
    assert (tmp_path / "run" / "averaged.npz").exists()


def test_unwritable_run_folder_is_reported_first(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    code, _, err = run_main(train.main, copy_args(blocker / "run"), capsys)
    assert_one_line_error(code, err, "train.py", "cannot write to the run folder")


def test_unwritable_checkpoint_folder_is_reported_before_training(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("a file where the checkpoint folder should be")
    code, _, err = run_main(train.main, copy_args(out), capsys)
    assert_one_line_error(code, err, "train.py", "cannot write to")
    assert not (out / "metrics.jsonl").exists()  # not one step was taken


def test_full_disk_is_reported_before_training(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 5_000_000, 5_000_000))
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out), capsys)
    assert_one_line_error(code, err, "train.py", "not enough free disk space")
    assert "5 MB are free" in err and "lower --keep-last" in err
    assert not (out / "metrics.jsonl").exists() and not list((out / "checkpoints").glob("*.npz"))


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    real = run_folder_module.save_checkpoint
    calls = []

    def failing(path, *a, **k):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, *a, **k)

    monkeypatch.setattr(run_folder_module, "save_checkpoint", failing)
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out, 9), capsys)
    assert_one_line_error(code, err, "train.py", "No space left on device")
    assert "step_0000003.npz is intact" in err and "--resume" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_0000003.npz"]
    load_checkpoint(out / "checkpoints" / "step_0000003.npz")


def test_interrupt_before_training_is_one_line(tmp_path, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "prepare", interrupted)
    code, _, err = run_main(train.main, copy_args(tmp_path / "run"), capsys)
    assert code == 130 and err.strip() == ("train.py: interrupted (Ctrl-C) before training started: nothing was "
                                           "trained; run the same command again")


def nan_on_calls(monkeypatch, bad):
    """Make the gradient norm NaN on the given (1-based) calls of the trainer's clip_grad_norm (once a step)."""
    real, count = trainer_module.clip_grad_norm, [0]

    def fake(params, max_norm):
        count[0] += 1
        return float("nan") if bad(count[0]) else real(params, max_norm)

    monkeypatch.setattr(trainer_module, "clip_grad_norm", fake)


def test_scattered_non_finite_steps_are_skipped_logged_and_counted(tmp_path, capsys, monkeypatch):
    """5 skipped steps in all, more than the limit of 3, but never two in a row: training goes on to the end."""
    nan_on_calls(monkeypatch, lambda call: call % 2 == 1 and call <= 9)
    out = tmp_path / "run"
    code, stdout, err = run_main(train.main, copy_args(out, 6, "--stop-after-nonfinite", "3"), capsys)
    assert code == 0, err
    assert "step 1: loss" in stdout
    assert "not finite, step skipped (1 skipped in all, 1 in a row, stopping at 3)" in stdout
    assert "(5 skipped in all, 1 in a row" in stdout
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    skips = [r for r in records if r.get("skipped")]
    assert [r["skipped_steps"] for r in skips] == [1, 2, 3, 4, 5]
    assert max(r["nonfinite_in_a_row"] for r in skips) == 1
    assert [r["step"] for r in records if "train_loss" in r] == list(range(1, 7))
    assert load_checkpoint(out / "checkpoints" / "step_0000006.npz").meta["skipped_steps"] == 5


def test_a_run_of_non_finite_steps_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    nan_on_calls(monkeypatch, lambda call: call >= 5)  # steps 1-4 fine, then nothing but NaN
    out = tmp_path / "run"
    code, stdout, err = run_main(train.main, copy_args(out, 30, "--stop-after-nonfinite", "3"), capsys)
    assert_one_line_error(code, err, "train.py", "3 steps in a row had a non-finite loss or gradient", status=3)
    assert "training stopped at step 4" in err and "step_0000003.npz" in err
    assert "(3 skipped in all, 3 in a row, stopping at 3)" in stdout
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_0000003.npz"]  # nothing written after it
    good = load_checkpoint(out / "checkpoints" / "step_0000003.npz")
    assert all(np.isfinite(v).all() for v in good.model.values())
    monkeypatch.undo()  # the fault is gone: --resume continues from the good checkpoint
    code, stdout, err = run_main(train.main, resume_args(out, 5), capsys)
    assert code == 0, err
    assert "resumed from step_0000003.npz" in stdout and (out / "checkpoints" / "step_0000005.npz").exists()


def test_the_default_limit_is_ten_in_a_row(tmp_path, monkeypatch):
    logged = []
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1), seed=5)
    data = PreparedData(TinyVocab(), {}, {"train": pairs(20)}, "task:faults")
    trainer = trainer_module.Trainer(model, data, TrainConfig(max_steps=1), tmp_path, progress=False, log=logged.append)
    for _ in range(9):
        trainer._skipped(7, float("nan"), float("inf"))
    with pytest.raises(trainer_module.StopTraining, match="10 steps in a row"):
        trainer._skipped(7, float("nan"), float("inf"))
    assert len(logged) == 10


def test_the_prepared_corpus_removed_while_training_does_not_stop_the_run(tmp_path, monkeypatch):
    """RUN/prepared/ deleted under a running train.py (a clean-up script, a user's rm): the splits are memory-mapped
    when training starts, so the mapping still holds them; validation went back to the offsets file by name and
    crashed (a bug report, the steps since the last checkpoint lost). It reads through the mapping now: the run
    validates and finishes, exit 0."""
    run = tmp_path / "run"
    real_validate, removed = trainer_module.Trainer.validate, []

    def validate(self):
        if not removed:
            shutil.rmtree(run / "prepared")
            removed.append(True)
        return real_validate(self)
    monkeypatch.setattr(trainer_module.Trainer, "validate", validate)
    assert train.main(args(run, 6, "--eval-every", "3", "--eval-sentences", "0")) == 0
    assert removed and not (run / "prepared").exists()
    assert [r["step"] for r in metrics(run) if "valid_loss" in r] == [3, 6]
