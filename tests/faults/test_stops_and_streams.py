"""Stops and streams say what to do (issue 68): a stop (SIGTERM, Ctrl-C, SIGHUP) at any phase of a training run
ends it with one line saying what is saved and the command that finishes the run (train.py's RunPhase, through
numformer.stop_signals.stops_say); standard output failing during training (``train.py ... | head -5`` with
PYTHONUNBUFFERED=1, ``> /dev/full``) is one line on standard error and the run goes on
(numformer.cli.standard_streams.output_that_may_go). At 4439216 a stop during the final averaging or the test
translation said only ``train.py: terminated``, ``| head -5`` ended the run at step 5 (exit 141, no checkpoint,
no word) and /dev/full gave three lines and exit 120 after the run."""
import os
import subprocess
import sys

import pytest

import train
from support import ROOT, copy_args, run_main

# train.py run as a user's shell runs it, SIGTERM sent by the process itself as the named phase starts: the final
# averaging (Trainer.average) or the test translation (translate_lines, after training).
HARNESS = r"""
import os, runpy, signal, sys
phase, root = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
sys.path.insert(0, root)
from numformer.training import trainer
from numformer.decoding import translation
real_average, real_translate = trainer.Trainer.average, translation.translate_lines
def average(self, *args, **kwargs):
    if phase == "averaging":
        os.kill(os.getpid(), signal.SIGTERM)
    return real_average(self, *args, **kwargs)
def translate_lines(model, vocab, lines, *args, **kwargs):
    if phase == "test translation" and len(lines) == 500:  # the test split, not a validation's few sentences
        os.kill(os.getpid(), signal.SIGTERM)
    return real_translate(model, vocab, lines, *args, **kwargs)
trainer.Trainer.average, translation.translate_lines = average, translate_lines
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def environment(**extra):
    return {**os.environ, "NUMFORMER_DEBUG": "", **extra,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def lines_of(err):
    return [line for line in err.splitlines() if line.strip() and not line.startswith("data:")]


def run_args(run, steps=6):
    """copy_args with the test translation (greedy: quick) and two checkpoints averaged."""
    args = [a for a in copy_args(run, steps) if a != "--no-test"]
    return args[:-2] + ["--average-last", "2", "--beam", "1"]


@pytest.mark.parametrize("phase, words", [("averaging", "the checkpoint averaging"),
                                          ("test translation", "the test translation")])
def test_a_stop_after_training_says_what_is_saved_and_the_command_that_finishes(phase, words, tmp_path, capsys):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", HARNESS, phase, str(ROOT), str(ROOT / "train.py"), *run_args(run)],
                          cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert lines_of(proc.stderr) == [
        f"train.py: terminated (SIGTERM) during {words}: training is done, its last step saved in "
        f"{run / 'checkpoints' / 'step_0000006.npz'}; finish the run (the final validation, averaging and test "
        f"translation) with train.py --out {run} --resume"], proc.stderr[-2000:]
    code, out, err = run_main(train.main, ["--out", str(run), "--resume", "--no-progress", "--beam", "1"], capsys)
    assert code == 0, err
    assert "nothing left to train" in out and (run / "test_scores.json").is_file()


def head(n, argv, tmp_path, **env):
    """``argv | head -n``: the first n lines of standard output read, then the reader gone."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=tmp_path, env=environment(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = [proc.stdout.readline() for _ in range(n)]
    proc.stdout.close()
    err = proc.stderr.read().decode("utf-8", "replace")
    return proc.wait(timeout=300), first, err


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED=1", "buffered"])
def test_training_piped_into_head_goes_on_to_the_end_with_one_line(unbuffered, tmp_path):
    run = tmp_path / "run"
    code, first, err = head(5, [str(ROOT / "train.py"), *copy_args(run, 30)], tmp_path, PYTHONUNBUFFERED=unbuffered)
    assert code == 0, err[-2000:]
    assert len([line for line in first if line]) == 5
    lines = lines_of(err)
    assert len(lines) <= 1 and all("standard output cannot be written any more (its reader has gone): the run "
                                   "goes on" in line for line in lines), err[-2000:]
    assert (run / "checkpoints" / "step_0000030.npz").is_file()


def test_training_with_standard_output_full_goes_on_with_one_line(tmp_path):
    run = tmp_path / "run"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *copy_args(run, 10)], cwd=tmp_path,
                              env=environment(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert lines_of(proc.stderr) == ["train.py: standard output cannot be written any more (No space left on device): "
                                     "the run goes on (the progress bar on standard error; every logged step in the "
                                     "run folder's metrics.jsonl), what it would print dropped"], proc.stderr[-2000:]
    assert (run / "checkpoints" / "step_0000010.npz").is_file()


def test_scores_with_their_readers_gone_are_a_quiet_141(tmp_path):
    """``translate.py --hypotheses H --reference R 2>&1 | head -1``, the reader gone before the scores: exit 141,
    no bug report (nothing written to a crash file in TMPDIR)."""
    text = tmp_path / "h.txt"
    text.write_text("a b c\nd e f\n", encoding="utf-8")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--hypotheses", str(text), "--reference",
                               str(text)], cwd=tmp_path, env=environment(TMPDIR=str(tmp_path)), stdout=write,
                              stderr=write, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141
    assert not list(tmp_path.glob("numformer-*crash*"))
