"""Advice that fits the cause (issue 68): a line that names a fault must send the user to its cause. At 4439216 a
checkpoint of another run copied into ``checkpoints/`` was refused with "restore the run's spm.model" (the
vocabulary was intact); a run's spm.model deleted and resumed retrained a vocabulary into the run folder and
re-encoded ``prepared/`` before refusing; an output name the file system takes but the temporary's tail made too
long was "cannot write in DIR"; ``hint`` in a read-only folder showed no hint and named an internal temporary;
``check RUN_FOLDER`` said "no such file"; a preset edited in run.json was reported as if the user had typed it; a
training file with old Mac line endings whose last line has no CR trained as one pair."""
import errno
import json
import os
import shutil

import pytest

import lab_files
import train
import translate
from fault_table import partials, snapshot
from grad_checks import exercises
from grad_checks.__main__ import main as grad_checks_main
from numformer import files
from numformer.checkpoint import load_checkpoint, save_checkpoint
from numformer.data.prepared_dataset import prepare
from support import assert_one_line_error, run_main, write_corpus


def resume(run, capsys, steps=7):
    return run_main(train.main, ["--out", str(run), "--resume", "--max-steps", str(steps), "--no-progress",
                                 "--no-test"], capsys)


def rewritten(source, target, vocab=True, **meta):
    """A copy of the training checkpoint ``source`` with ``meta`` changed (and without its vocabulary)."""
    ck = load_checkpoint(source)
    save_checkpoint(target, ck.model, {**ck.meta, **meta}, ck.optimizer, vocab=ck.vocab if vocab else None)
    return target


def test_a_checkpoint_of_another_run_is_named_as_such_with_the_advice_to_remove_it(run_copy, capsys):
    own = sorted((run_copy / "checkpoints").iterdir())
    foreign = rewritten(own[-1], run_copy / "checkpoints" / "step_0000009.npz", data="task:reverse")
    code, _, err = resume(run_copy, capsys, 12)
    assert_one_line_error(code, err, "train.py", f"{foreign} is a checkpoint of another run (trained on task:reverse, "
                                                 "this run on task:copy): move it out of")
    assert "spm.model" not in err
    foreign.unlink()  # the advice followed: the run resumes from its own newest checkpoint
    code, out, err = resume(run_copy, capsys)
    assert code == 0 and "resumed from step_0000006.npz" in out, err


def test_a_checkpoint_of_another_vocabulary_among_the_runs_own_is_named_foreign(run_copy, capsys):
    own = sorted((run_copy / "checkpoints").iterdir())
    foreign = rewritten(own[-1], run_copy / "checkpoints" / "step_0000009.npz", vocab_sha256="0" * 64)
    code, _, err = resume(run_copy, capsys, 12)
    assert_one_line_error(code, err, "train.py", f"{foreign} is a checkpoint of another run (its vocabulary or model "
                                                 "differs from this run's")


def test_a_missing_vocabulary_is_restored_from_the_checkpoint_and_prepared_kept(run_copy, capsys):
    vocab = run_copy / "spm.model"
    original = vocab.read_bytes()
    prepared = snapshot(run_copy / "prepared")
    vocab.unlink()
    code, out, err = resume(run_copy, capsys)
    assert code == 0, err
    assert f"vocabulary: {vocab} was missing: restored from {run_copy / 'checkpoints' / 'step_0000006.npz'}" in out
    assert vocab.read_bytes() == original
    assert snapshot(run_copy / "prepared") == prepared and "prepared before" in out  # never re-encoded


def test_a_missing_vocabulary_no_checkpoint_carries_is_refused_before_any_write(run_copy, capsys):
    for path in sorted((run_copy / "checkpoints").iterdir()):
        rewritten(path, path, vocab=False)
    (run_copy / "spm.model").unlink()
    before = snapshot(run_copy)
    code, _, err = resume(run_copy, capsys)
    assert_one_line_error(code, err, "train.py", f"{run_copy / 'spm.model'} is missing and no checkpoint in")
    after = snapshot(run_copy)
    assert {k: v for k, v in after.items() if k != "run.lock"} == {k: v for k, v in before.items() if k != "run.lock"}
    # (no vocabulary trained into the run, prepared/ not re-encoded; the lock is the resume's own)


def test_a_replaced_vocabulary_is_answered_with_how_to_restore_it(run_copy, random_run, capsys):
    shutil.copyfile(random_run / "spm.model", run_copy / "spm.model")
    code, _, err = resume(run_copy, capsys)
    assert_one_line_error(code, err, "train.py", "remove (or move away) the one there and resume")
    (run_copy / "spm.model").unlink()  # the advice followed
    code, out, err = resume(run_copy, capsys)
    assert code == 0 and "restored from" in out, err


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("a b c\n", encoding="utf-8")
    return path


def test_an_output_name_the_file_system_takes_is_written_whatever_the_temporarys_tail(copy_run, text, tmp_path,
                                                                                     capsys):
    out = tmp_path / ("x" * 246 + ".txt")  # 250 bytes: the file system takes it, the temporary's tail does not fit
    code, _, err = run_main(translate.main, ["--model", str(copy_run), "--input", str(text), "--output", str(out),
                                             "--greedy"], capsys)
    assert code == 0, err
    assert out.read_text(encoding="utf-8").count("\n") == 1 and partials(tmp_path) == []


def test_an_output_name_longer_than_the_file_system_takes_is_said_to_be(copy_run, text, tmp_path, capsys):
    out = tmp_path / ("y" * 300 + ".txt")
    code, _, err = run_main(translate.main, ["--model", str(copy_run), "--input", str(text), "--output", str(out),
                                             "--greedy"], capsys)
    assert_one_line_error(code, err, "translate.py", "is 304 bytes, longer than the 255 the file system of")


@pytest.fixture
def exercise_file(tmp_path):
    ex = exercises.get("layernorm")
    return lab_files.write(ex, ex.target, tmp_path)


def test_hint_in_a_folder_that_cannot_be_written_shows_the_hint(exercise_file, monkeypatch, capsys):
    """A course's read-only folder (as root, whom permissions do not stop, the file system's refusal is played)."""
    if os.geteuid() != 0:
        exercise_file.parent.chmod(0o500)
    else:
        def refused(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied",
                                  str(exercise_file.parent / ".my_layernorm.py.hints.numformer-partial-1-x"))
        monkeypatch.setattr(files.tempfile, "mkstemp", refused)
    try:
        code, out, err = run_main(grad_checks_main, ["hint", str(exercise_file)], capsys)
    finally:
        exercise_file.parent.chmod(0o700)
    assert code == 0, err
    assert "the derivation, step 1 of" in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot keep the count of steps shown" in lines[0], err
    assert "numformer-partial" not in err


def test_check_given_a_run_folder_says_it_is_one_and_what_to_pass(copy_run, capsys):
    code, _, err = run_main(grad_checks_main, ["check", str(copy_run)], capsys)
    assert_one_line_error(code, err, "python -m grad_checks",
                          f"{copy_run} is a numformer run folder, not an exercise file")
    assert f"--checkpoint {copy_run}" in err


@pytest.mark.parametrize("field, value, needle", [
    ("preset", "huge", "run.json's preset is 'huge', not a preset"),
    ("preset", "small", "run.json's preset is 'small', whose model is not the one"),
    ("data", 42, "run.json's data is 42, not a data source"),
    ("vocab_size_requested", -3, "run.json's vocab_size_requested must be an integer from 1 to"),
    ("processes", "two", "run.json's processes must be an integer from 1 to"),
    ("train_config", "fast", "run.json's train_config is 'fast', not the run's settings"),
])
def test_every_field_of_run_json_is_named_as_coming_from_it(field, value, needle, run_copy, capsys):
    settings = json.loads((run_copy / "run.json").read_text())
    settings[field] = value
    (run_copy / "run.json").write_text(json.dumps(settings))
    code, _, err = resume(run_copy, capsys)
    assert_one_line_error(code, err, "train.py", f"{run_copy / 'run.json'}'s {needle.split(' ', 1)[1]}")
    assert "--preset" not in err.split("run.json")[0]  # no flag the user never typed


LINES = ["the cat sat on the mat", "a dog ran in the park", "birds sing in the morning", "we read a good book"] * 5


def test_old_mac_line_endings_without_a_last_cr_are_lines(tmp_path):
    mac = "\r".join(LINES).encode("utf-8")  # no CR after the last line
    text = "".join(line + "\n" for line in LINES)
    folder = write_corpus(tmp_path / "c", {"train.src": mac, "train.tgt": mac, "valid.src": text, "valid.tgt": text,
                                           "test.src": text, "test.tgt": text})
    data = prepare(tmp_path / "run", data_dir=folder, vocab_size=60, log=lambda line: None)
    assert len(data.ids["train"]) == len(LINES)
