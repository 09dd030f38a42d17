"""--resume continues the run in its folder and nothing else: train.py --out RUN --resume alone takes the run's
data, preset and settings from run.json; another preset, task, data folder, seed, model flag or vocabulary
is refused in one line and changes nothing; a damaged newest checkpoint is skipped; --vocab-size and an
spm.model an earlier attempt left are never silently at odds."""
import json
import shutil

import pytest

import train
from numformer.checkpoint import load_checkpoint, vocab_fingerprint
from numformer.data import SubwordVocab, make_synthetic
from numformer.data.prepared_dataset import prepare
from support import assert_one_line_error, copy_args, corrupt, resume_args, run_main, write_corpus


def test_existing_run_needs_resume(copy_run, capsys):
    code, _, err = run_main(train.main, copy_args(copy_run), capsys)
    assert_one_line_error(code, err, "train.py", "pass --resume")


RESUME_MISMATCH = {
    "another preset": (["--task", "copy", "--preset", "small"], "trained with --preset tiny, not small"),
    "another task": (["--task", "reverse"], "trained on task copy, not task reverse"),
    "another seed": (["--seed", "7"], "differs from the run's seed 1"),
    "another model flag": (["--pre-norm"], "pre_norm False (asked: True)"),
    "another dropout": (["--dropout", "0.3"], "dropout 0.1 (asked: 0.3)"),
    "other positions": (["--positional", "learned"], "positional 'sinusoidal' (asked: 'learned')"),
}


@pytest.mark.parametrize("case", list(RESUME_MISMATCH))
def test_resume_with_contradicting_flags_is_one_line_and_changes_nothing(case, run_copy, capsys):
    # run.lock records who last held the folder (this process, now): everything else must stay as it was
    before = {p.name: p.read_bytes() for p in run_copy.rglob("*") if p.is_file() and p.name != "run.lock"}
    flags, needle = RESUME_MISMATCH[case]
    code, _, err = run_main(train.main, resume_args(run_copy, 9, *flags), capsys)
    assert_one_line_error(code, err, "train.py", needle)
    after = {p.name: p.read_bytes() for p in run_copy.rglob("*") if p.is_file() and p.name != "run.lock"}
    assert after == before


def test_resume_with_another_vocabulary_is_one_line(run_copy, capsys):
    vocab = SubwordVocab.load(run_copy / "spm.model")
    upper = make_synthetic("copy", 2000, 1, 1, seed=9, vocab=tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))["train"][0]
    other = SubwordVocab.train(upper, run_copy / "other", vocab.size)
    assert other.size == vocab.size  # same size: only the fingerprint tells them apart
    shutil.copy(run_copy / "other.model", run_copy / "spm.model")
    code, _, err = run_main(train.main, resume_args(run_copy, 9), capsys)
    assert_one_line_error(code, err, "train.py", "another vocabulary")


def test_resume_uses_the_runs_own_settings(run_copy, capsys):
    """`train.py --out RUN --resume` needs no other flag: data, preset and settings come from the run."""
    code, out, err = run_main(train.main, resume_args(run_copy, 7), capsys)
    assert code == 0, err
    assert "resumed from step_0000006.npz" in out
    assert (run_copy / "checkpoints" / "step_0000007.npz").exists()
    run = json.loads((run_copy / "run.json").read_text())
    assert run["preset"] == "tiny"
    assert run["train_config"]["max_tokens"] == 400 and run["train_config"]["max_steps"] == 7


def test_training_checkpoints_record_the_vocabulary(copy_run):
    meta = load_checkpoint(copy_run / "checkpoints" / "step_0000006.npz").meta
    assert meta["vocab_sha256"] == vocab_fingerprint(SubwordVocab.load(copy_run / "spm.model"))


@pytest.mark.parametrize("kind", ["truncated", "flipped bytes"])
def test_damaged_newest_checkpoint_is_skipped_by_resume(kind, run_copy, capsys):
    corrupt(kind, run_copy / "checkpoints" / "step_0000006.npz")
    code, out, err = run_main(train.main, resume_args(run_copy, 4), capsys)
    assert code == 0, err
    assert "skipping unreadable checkpoint (renamed to step_0000006.npz.corrupt)" in out
    assert "resumed from step_0000003.npz" in out
    load_checkpoint(run_copy / "checkpoints" / "step_0000004.npz")


def test_vocab_size_is_not_ignored_when_an_earlier_attempt_left_spm_model(tmp_path, capsys):
    out = tmp_path / "run"
    prepare(out, task="copy", vocab_size=40)  # an earlier attempt that stopped after the vocabulary
    assert SubwordVocab.load(out / "spm.model").size == 40
    code, stdout, err = run_main(train.main, copy_args(out, 1, "--vocab-size", "50"), capsys)
    assert code == 0, err
    assert "has 40 pieces, --vocab-size asks for 50: retraining it" in stdout
    assert SubwordVocab.load(out / "spm.model").size == 50
    assert json.loads((out / "run.json").read_text())["model_config"]["vocab_size"] == 50


def test_vocab_size_of_a_resumed_run_cannot_change(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(train.main, copy_args(out, 1, "--vocab-size", "40"), capsys)[0] == 0
    code, _, err = run_main(train.main, ["--out", str(out), "--resume", "--max-steps", "2", "--no-progress",
                                         "--vocab-size", "50"], capsys)
    assert_one_line_error(code, err, "train.py", "--vocab-size 50 differs from the run's vocabulary (40 pieces")
    code, stdout, err = run_main(train.main, ["--out", str(out), "--resume", "--max-steps", "2", "--no-progress",
                                              "--no-test", "--vocab-size", "40"], capsys)
    assert code == 0, err


def test_resume_with_another_data_folder_is_refused(tmp_path, capsys, monkeypatch):
    a = write_corpus(tmp_path / "a", {})
    b = write_corpus(tmp_path / "b", {})
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--vocab-size", "30", "--out", str(out), "--no-progress", "--eval-every", "0",
            "--no-test", "--save-every", "1", "--average-last", "1"]
    assert run_main(train.main, ["--data", str(a), "--max-steps", "1", *args], capsys)[0] == 0
    code, _, err = run_main(train.main, ["--data", str(b), "--max-steps", "2", "--resume", *args], capsys)
    assert_one_line_error(code, err, "train.py", f"was trained on data {a.resolve()}, not data {b}")
    monkeypatch.chdir(tmp_path)  # the same folder, spelled another way (relative), is the same data
    code, _, err = run_main(train.main, ["--data", "a", "--max-steps", "2", "--resume", *args], capsys)
    assert code == 0, err
