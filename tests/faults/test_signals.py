"""SIGTERM (a scheduler's stop, ``kill``) and SIGHUP (the terminal closed) are handled as Ctrl-C is, by every
command that writes (tests/fault_table.py): sent at the moment a finished temporary is about to become its
target, one line (``terminated``, ``hung up``), exit 143 or 129, the target as it was and no temporary
left; a prepared output (numformer.prepare, train.py's run folder) is put back as found. Training's own
answer (a checkpoint of the current step, then --resume continues exactly) is
tests/training/test_faults.py's ``test_interrupt_saves_the_current_step_and_resume_continues``; here, a second
SIGTERM during training (mid-step, or while that checkpoint is being written) stops at once with the newest complete
checkpoint intact, and a SIGHUP ignored from the start (``nohup``) stays ignored while training goes on."""
import os
import subprocess
import sys

import pytest

from fault_table import partials, snapshot
from numformer.checkpoint import load_checkpoint
from support import ROOT, copy_args
from test_interrupted_and_full_disk import ROW_NAMES, error_lines, faulted

SIGNALS = {"sigterm": (143, "terminated"), "sighup": (129, "hung up")}
# Each row with SIGTERM; SIGHUP takes the same path (numformer/stop_signals.py): the rows that prepare a folder.
CASES = [(row, "sigterm") for row in ROW_NAMES] + [(row, "sighup") for row in ("translate", "prepare", "train")]


@pytest.mark.parametrize("name, fault", CASES, ids=[f"{f}-{r}" for r, f in CASES])
def test_a_stop_signal_leaves_the_target_and_no_temporary(name, fault, tmp_path, fault_inputs):
    status, word = SIGNALS[fault]
    out, before, code, err, met = faulted(name, tmp_path, fault_inputs, fault)
    assert code == status, (code, err[-2000:])
    last = error_lines(err)[-1]
    if name == "train":  # a run also says what is saved and what to do (train.py's RunPhase)
        assert last.endswith(f"{word} ({fault.upper()}) before training started: nothing was trained; run the same "
                             "command again"), err[-2000:]
    else:
        assert last.endswith(word), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert partials(out) == []
    after = snapshot(out)
    assert {k: after.get(k) for k in before} == before  # what was there is whole
    if name in ("prepare", "train"):  # a folder this command created: put back as found (gone)
        assert set(after) == set(before), sorted(set(after) - set(before))


# -- training: a second signal, and a hang-up ignored from the start ------------------------------------------

# Runs train.py in a fresh process as a user's shell would, with the signals sent by the process itself at a chosen
# step, so that the moment is the same on every machine: ``twice mid-step`` sends SIGTERM twice after step 4's
# update, ``again mid-save`` sends SIGTERM after step 4 and again as the checkpoint of step 4 is about to replace its
# target (numformer.files' os.replace), ``nohup`` starts with SIGHUP ignored, as nohup does, and sends SIGHUP after
# step 2, then SIGTERM after step 4.
TRAIN_HARNESS = r"""
import os, signal, sys, types
plan, root = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
sys.path.insert(0, root)
if plan == "nohup":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
import numformer.files as files
from numformer.training import trainer
real_step, real_replace, armed = trainer.Trainer.train_step, os.replace, []
def send(sig):
    os.kill(os.getpid(), sig)
def train_step(self, *args, **kwargs):
    result = real_step(self, *args, **kwargs)
    step = self.optimizer.step_count
    if plan == "twice mid-step" and step == 4:
        send(signal.SIGTERM)
        send(signal.SIGTERM)
    if plan == "again mid-save" and step == 4:
        armed.append(True)
        send(signal.SIGTERM)
    if plan == "nohup" and step == 2:
        send(signal.SIGHUP)
    if plan == "nohup" and step == 4:
        send(signal.SIGTERM)
    return result
def replace(src, dst, *args, **kwargs):
    if armed and os.path.basename(dst).startswith("step_"):
        armed.clear()
        send(signal.SIGTERM)
    return real_replace(src, dst, *args, **kwargs)
files.os = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
files.os.replace = replace
trainer.Trainer.train_step = train_step
import runpy
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_with_signals(plan, tmp_path, steps=8):
    """train.py (the copy task, a checkpoint every 3 steps) under ``plan``; -> (exit status, stderr, run folder)."""
    run = tmp_path / "run"
    env = {**os.environ, "NUMFORMER_DEBUG": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", TRAIN_HARNESS, plan, str(ROOT), str(ROOT / "train.py"),
                           *copy_args(run, steps)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr, run


def checkpoint_steps(run):
    return [int(p.stem.split("_")[1]) for p in sorted((run / "checkpoints").glob("step_*.npz"))]


@pytest.mark.parametrize("plan", ["twice mid-step", "again mid-save"])
def test_a_second_sigterm_stops_training_at_once(plan, tmp_path):
    """The first SIGTERM asks for a checkpoint of the current step; a second one, sent before that checkpoint is
    complete, stops at once: exit 143, one line naming the newest complete checkpoint (step 3, loadable) and the
    command that goes on, no temporary, nothing of step 4 written."""
    code, err, run = train_with_signals(plan, tmp_path)
    assert code == 143, err[-2000:]
    assert error_lines(err) == [f"train.py: terminated (SIGTERM) again, before the checkpoint of step 4 was complete: "
                                f"the newest checkpoint is {run / 'checkpoints' / 'step_0000003.npz'}; continue with "
                                f"train.py --out {run} --resume"] and "Traceback" not in err, err[-2000:]
    assert partials(run) == []
    assert checkpoint_steps(run) == [3]
    assert load_checkpoint(run / "checkpoints" / "step_0000003.npz").optimizer["step_count"] == 3


def test_sighup_ignored_from_the_start_stays_ignored_during_training(tmp_path):
    """Started as nohup starts a command (SIGHUP ignored), training goes on past a hang-up; the scheduler's SIGTERM
    still stops it with its own line, a checkpoint of the step it stopped at, exit 143."""
    code, err, run = train_with_signals("nohup", tmp_path)
    assert code == 143, err[-2000:]
    assert error_lines(err) == [f"terminated (SIGTERM) at step 4: saved {run / 'checkpoints' / 'step_0000004.npz'}; "
                                "continue with --resume"], err[-2000:]
    assert checkpoint_steps(run) == [3, 4]
    assert load_checkpoint(run / "checkpoints" / "step_0000004.npz").optimizer["step_count"] == 4
