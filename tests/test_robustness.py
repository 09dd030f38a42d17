"""Robustness: every bad input gets one line on stderr and a non-zero exit status (no traceback),
translate.py keeps one output line per input line whatever the text, long lines are translated
(whole up to the positional table, split beyond), non-finite steps are skipped and a run of them
stops training with the last good checkpoint intact, a full disk is reported before training.

Crash faults (SIGKILL, SIGINT, resume equality) are in test_robust_faults.py.
"""
import json
import shutil
import subprocess
import sys
import zipfile
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cuda_available

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
import translate  # noqa: E402
from numformer import run_folder as run_folder_module  # noqa: E402
from numformer import trainer as trainer_module  # noqa: E402
from numformer import translation  # noqa: E402
from numformer.checkpoint import load_checkpoint, save_checkpoint, vocab_fingerprint  # noqa: E402
from numformer.cli_common import load_model  # noqa: E402
from numformer.data import CORPUS_FILES, SubwordVocab, make_synthetic, normalize_line  # noqa: E402
from numformer.decode import Hypothesis  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.presets import get_preset  # noqa: E402
from numformer.distributed import SINGLE  # noqa: E402
from numformer.run_folder import RunFolder  # noqa: E402
from numformer.train_config import TrainConfig  # noqa: E402
from numformer.translation import DecodeOptions, split_long, translate_lines  # noqa: E402

TEXT = [
    "In the beginning God created the heavens and the earth.",
    "En el principio creó Dios los cielos y la tierra.",
    "Jesus wept. Jesús lloró.",
    "Привет мир, 你好世界, مرحبا بالعالم, γειά σου κόσμε 😀",
] * 5


def copy_args(out, steps=6, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "3", "--eval-every", "0", "--no-test", "--log-every", "1", "--max-tokens", "400",
            "--average-last", "1", *extra]


def resume_args(out, steps, *extra):
    return ["--out", str(out), "--resume", "--max-steps", str(steps), "--no-progress", "--no-test", *extra]


def run_main(main, argv, capsys):
    """Run a CLI main in-process; returns (exit status, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, prog, needle, status=2):
    assert code == status, (code, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error:"), err
    assert needle.lower() in lines[0].lower(), (needle, err)


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """A tiny model trained 6 steps on the copy task: checkpoints at 3 and 6, spm.model, run.json."""
    out = tmp_path_factory.mktemp("copy") / "run"
    assert train.main(copy_args(out)) == 0
    return out


@pytest.fixture
def run_copy(copy_run, tmp_path):
    """A private copy of copy_run (for tests that change it)."""
    return Path(shutil.copytree(copy_run, tmp_path / "run"))


VOCAB_SIZE = 400


def make_random_run(folder, max_len=32):
    """A run folder with a random-weight model (1 layer, d_model 16, positional table ``max_len``) and a
    byte-fallback vocabulary: such a vocabulary can emit <0x0A>, i.e. a newline, from a random model."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = SubwordVocab.train(TEXT, folder / "spm", VOCAB_SIZE, byte_fallback=True)
    cfg = get_preset("tiny", vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=1, max_len=max_len)
    model = Transformer(cfg, seed=0)
    meta = {"model_config": cfg.to_dict(), "vocab_sha256": vocab_fingerprint(vocab), "step": 1}
    save_checkpoint(folder / "checkpoints" / "step_0000001.npz", model.state_dict(), meta)
    return folder


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    return make_random_run(tmp_path_factory.mktemp("random") / "run")


def write_corpus(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        data = files.get(name, "one two three\nfour five six\n")
        (folder / name).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return folder


# -- bad training input -------------------------------------------------------------------------------
BAD_DATA = {
    "missing folder": (None, "does not exist"),
    "missing file": ({"train.tgt": None}, "lacks train.tgt"),
    "line counts differ": ({"train.src": "a\nb\nc\n", "train.tgt": "x\ny\n"}, "has 3 lines but"),
    "empty training data": ({"train.src": "", "train.tgt": ""}, "empty"),
    "only empty lines": ({"train.src": "\n \n", "train.tgt": "x\n\n"}, "no pair with both sides non-empty"),
    "not utf-8": ({"train.tgt": b"fine\ncaf\xe9\n"}, "train.tgt line 2 is not valid UTF-8"),
    "a folder instead of a file": ({"valid.src": "DIR"}, "lacks valid.src"),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_training_data_is_one_line(case, tmp_path, capsys):
    files, needle = BAD_DATA[case]
    folder = tmp_path / "corpus"
    if files is not None:
        write_corpus(folder, {k: v for k, v in files.items() if v not in (None, "DIR")})
        for name, v in files.items():
            if v is None:
                (folder / name).unlink()
            elif v == "DIR":
                (folder / name).unlink()
                (folder / name).mkdir()
    code, _, err = run_main(train.main, ["--data", str(folder), "--preset", "tiny", "--max-steps", "1",
                                         "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", needle)
    if case == "line counts differ":
        assert "has 2" in err  # both counts are named
    assert not (tmp_path / "run" / "checkpoints").exists()


BAD_FLAGS = {
    "unknown corpus": (["--corpus", "klingon"], "unknown corpus 'klingon'"),
    "unknown preset": (["--task", "copy", "--preset", "huge"], "invalid choice"),
    "unknown task": (["--task", "sort"], "invalid choice"),
    "no data": (["--preset", "tiny"], "exactly one of"),
    "two data flags": (["--task", "copy", "--corpus", "bible-en-es"], "exactly one of"),
    "zero steps": (["--task", "copy", "--max-steps", "0"], "--max-steps: must be at least 1"),
    "negative tokens": (["--task", "copy", "--max-tokens", "-5"], "at least 1"),
    "not a number": (["--task", "copy", "--max-minutes", "soon"], "expected a number"),
    "nan minutes": (["--task", "copy", "--max-minutes", "nan"], "positive"),
    "dropout of 1.5": (["--task", "copy", "--dropout", "1.5"], "in [0, 1)"),
    "negative clip": (["--task", "copy", "--clip-norm", "-1"], ">= 0"),
    "average more than kept": (["--task", "copy", "--keep-last", "2", "--average-last", "3"], "exceeds --keep-last"),
    "average more than default kept": (["--task", "copy", "--average-last", "6", "--max-steps", "1"],
                                       "cannot average the last 6"),
    "max-len beyond the table": (["--task", "copy", "--preset", "tiny", "--max-len", "5000", "--max-steps", "1"],
                                 "exceeds the model's positional table (1024)"),
    "max-len of 1": (["--task", "copy", "--preset", "tiny", "--max-len", "1", "--max-steps", "1"], "at least 2"),
    "cuda without cupy or gpu": (["--task", "copy", "--device", "cuda"], "--device cpu"),
    "unknown device": (["--task", "copy", "--device", "tpu"], "unknown device"),
    "resume without out": (["--resume"], "needs --out"),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_bad_train_flags_are_one_line(case, tmp_path, capsys):
    argv, needle = BAD_FLAGS[case]
    if case == "cuda without cupy or gpu" and cuda_available():
        pytest.skip("this machine has cupy and a GPU")
    if "--out" not in argv and case != "resume without out":
        argv = argv + ["--out", str(tmp_path / "run")]
    code, _, err = run_main(train.main, argv + ["--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", needle)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_existing_run_needs_resume(copy_run, capsys):
    code, _, err = run_main(train.main, copy_args(copy_run), capsys)
    assert_one_line_error(code, err, "train.py", "pass --resume")


RESUME_MISMATCH = {
    "another preset": (["--task", "copy", "--preset", "small"], "trained with --preset tiny, not small"),
    "another task": (["--task", "reverse"], "trained on task copy, not task reverse"),
    "another seed": (["--seed", "7"], "differs from the run's seed 1"),
    "another model flag": (["--pre-norm"], "pre_norm False (asked: True)"),
    "another dropout": (["--dropout", "0.3"], "dropout 0.1 (asked: 0.3)"),
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


# -- run folder and disk ----------------------------------------------------------------------------------
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
    assert code == 130 and err.strip() == "train.py: interrupted"


# -- non-finite steps -------------------------------------------------------------------------------------
def nan_on_calls(monkeypatch, bad):
    """Make the gradient norm NaN on the given (1-based) calls of trainer.grad_norm."""
    real, count = trainer_module.grad_norm, [0]

    def fake(params):
        count[0] += 1
        return float("nan") if bad(count[0]) else real(params)

    monkeypatch.setattr(trainer_module, "grad_norm", fake)


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
    trainer = trainer_module.Trainer.__new__(trainer_module.Trainer)
    trainer.cfg = TrainConfig(max_steps=1)
    trainer.skipped_steps = trainer.nonfinite_in_a_row = 0
    trainer.log, trainer.elapsed, trainer.epoch = logged.append, 0.0, 0
    trainer.world, trainer.folder = SINGLE, RunFolder(tmp_path)
    for _ in range(9):
        trainer._skipped(7, float("nan"), float("inf"))
    with pytest.raises(trainer_module.StopTraining, match="10 steps in a row"):
        trainer._skipped(7, float("nan"), float("inf"))
    assert len(logged) == 10


# -- checkpoints and vocabularies at translation time -------------------------------------------------------
def corrupt(kind, path):
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "junk":
        path.write_bytes(b"this is not a checkpoint" * 100)
    elif kind == "flipped bytes":  # 64 bytes in the middle of the largest weight's data (the zip's CRC-32
        mid = weight_data_middle(path, data)  # catches it): never the npy header, never padding
        path.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid: mid + 64]) + data[mid + 64:])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "no meta":
        np.savez(path, x=np.zeros(3))
    elif kind == "wrong shapes":
        ck = load_checkpoint(path)
        ck.meta["model_config"]["d_ff"] = 64
        save_checkpoint(path, ck.model, ck.meta)
    elif kind == "bad config":
        ck = load_checkpoint(path)
        ck.meta["model_config"]["colour"] = "blue"
        save_checkpoint(path, ck.model, ck.meta)


def weight_data_middle(path, data):
    """The file offset of the middle of the largest ``model/`` array's data: after the zip's local header
    (its own name and extra-field lengths, read from the file) and after the .npy header."""
    import struct

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if i.filename.startswith("model/")), key=lambda i: i.file_size)
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            read_header(f)
            npy_header = f.tell()
    assert info.compress_type == zipfile.ZIP_STORED  # np.savez stores: file bytes are the .npy bytes
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len + npy_header
    n_data = info.file_size - npy_header
    assert n_data >= 1024, "the largest weight is too small to corrupt 64 bytes of it"
    return start + n_data // 2


CHECKPOINT_CASES = {
    "truncated": "truncated or corrupt",
    "junk": "truncated or corrupt",
    "flipped bytes": "truncated or corrupt",
    "empty": "truncated or corrupt",
    "no meta": "not a numformer checkpoint",
    "wrong shapes": "does not fit its own config",
    "bad config": "unreadable model config",
}


@pytest.mark.parametrize("kind", list(CHECKPOINT_CASES))
def test_damaged_checkpoint_is_one_line_for_translate(kind, run_copy, tmp_path, capsys):
    ck = run_copy / "checkpoints" / "step_0000006.npz"
    corrupt(kind, ck)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, out, err = run_main(translate.main, ["--model", str(ck), "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_line_error(code, err, "translate.py", CHECKPOINT_CASES[kind])
    assert out == ""


@pytest.mark.parametrize("kind", ["truncated", "flipped bytes"])
def test_damaged_newest_checkpoint_is_skipped_by_resume(kind, run_copy, capsys):
    corrupt(kind, run_copy / "checkpoints" / "step_0000006.npz")
    code, out, err = run_main(train.main, resume_args(run_copy, 4), capsys)
    assert code == 0, err
    assert "skipping unreadable checkpoint (renamed to step_0000006.npz.corrupt)" in out
    assert "resumed from step_0000003.npz" in out
    load_checkpoint(run_copy / "checkpoints" / "step_0000004.npz")


def test_missing_model_and_vocabulary_problems_are_one_line(copy_run, random_run, tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("a b c\n")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a sentencepiece model")
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    cases = [
        (["--model", str(tmp_path / "nope.npz")], "does not exist"),
        (["--model", str(empty_run)], "holds no checkpoint"),
        (["--model", str(copy_run), "--vocab", str(tmp_path / "nope.model")], "not found"),
        (["--model", str(copy_run), "--vocab", str(junk)], "not a sentencepiece model"),
        (["--model", str(copy_run), "--vocab", str(random_run / "spm.model")], "pieces but checkpoint"),
        *([] if cuda_available() else [(["--model", str(copy_run), "--device", "cuda"], "--device cpu")]),
        (["--model", str(copy_run), "--input", str(tmp_path / "none.txt")], "file not found"),
        (["--model", str(copy_run), "--input", str(inp), "--reference", str(tmp_path / "none.txt")], "file not found"),
        (["--model", str(copy_run), "--greedy", "--beam", "4"], "contradict"),
        (["--model", str(copy_run), "--beam", "2", "--nbest", "3"], "cannot exceed the beam size 2"),
        (["--model", str(copy_run), "--beam", "0"], "at least 1"),
        (["--model", str(copy_run), "--max-len-b", "-1"], "at least 0"),
        (["--model", str(copy_run), "--output", str(tmp_path / "no" / "such" / "dir" / "out.txt")], "cannot write"),
    ]
    for argv, needle in cases:
        if "--input" not in argv:
            argv = argv + ["--input", str(inp)]
        code, out, err = run_main(translate.main, argv, capsys)
        assert_one_line_error(code, err, "translate.py", needle)
        assert out == ""
    ref = tmp_path / "ref.txt"
    ref.write_text("x\ny\n")
    code, _, err = run_main(translate.main, ["--model", str(copy_run), "--input", str(inp), "--reference", str(ref)],
                            capsys)
    assert_one_line_error(code, err, "translate.py", "has 2 lines but the input has 1")


def test_vocabulary_of_the_same_size_from_another_run_is_refused(tmp_path, capsys):
    """The checkpoint records the sha256 of its spm.model; a same-sized other vocabulary is refused."""
    run = make_random_run(tmp_path / "run")
    vocab = SubwordVocab.load(run / "spm.model")
    other = SubwordVocab.train([line[::-1] for line in TEXT], tmp_path / "other", VOCAB_SIZE, byte_fallback=True)
    assert other.size == vocab.size
    (tmp_path / "in.txt").write_text("hello\n")
    code, _, err = run_main(translate.main, ["--model", str(run), "--vocab", str(tmp_path / "other.model"),
                                             "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_line_error(code, err, "translate.py", "sha256 differs")
    # a checkpoint written before fingerprints existed is still accepted (size check only)
    ck_path = run / "checkpoints" / "step_0000001.npz"
    ck = load_checkpoint(ck_path)
    del ck.meta["vocab_sha256"]
    save_checkpoint(ck_path, ck.model, ck.meta)
    load_model(run)


def test_training_checkpoints_record_the_vocabulary(copy_run):
    meta = load_checkpoint(copy_run / "checkpoints" / "step_0000006.npz").meta
    assert meta["vocab_sha256"] == vocab_fingerprint(SubwordVocab.load(copy_run / "spm.model"))


def test_bad_utf8_on_standard_input_names_the_line(copy_run):
    out = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(copy_run)],
                         input=b"a b\nc d\ne \xff f\n", capture_output=True)
    err = out.stderr.decode()
    assert out.returncode == 2 and "Traceback" not in err and out.stdout == b""
    assert err.strip().count("\n") == 0
    assert "standard input line 3 is not valid UTF-8" in err


# -- the one-line-per-line contract ---------------------------------------------------------------------------
SPECIAL_LINES = [
    "", " ", "\t \t", "\r", "\x0b", "\x0c", "\x1c", "\x1d\x1e\x1f", "\x85", "\u2028", "\u2029", "a\u2028b",
    "x\x0cy\x0bz", "\x00", "\x07\x1b[31mred\x1b[0m", "😀🎉👍🏽", "👨‍👩‍👧‍👦 family",
    "Привет мир", "你好，世界", "مرحبا بالعالم", "mixed: English, español, Ελληνικά, 日本語, עברית 😀",
    "\ufeffbom inside", "\u200b\u200d",
    "tab\tseparated\tcells", "▁▁already▁pieces", "<s> </s> <pad> <unk>", "a" * 400,
    " ".join(["word"] * 150), "😀" * 60, "\ud7ff\ue000\uffff\U0010ffff",
]
line_text = st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=80)
lines_strategy = st.lists(st.one_of(line_text, st.sampled_from(SPECIAL_LINES)), min_size=0, max_size=8)


def identity_search(model, src, bos_id, eos_id, *args, **kwargs):
    """A stand-in for greedy search that copies the source: makes the plumbing's order checkable."""
    assert src.shape[1] <= model.cfg.max_len  # the encoder never sees more than its table
    out = []
    for row in np.asarray(src):
        ids = [int(t) for t in row if t != model.cfg.pad_id]
        assert ids[-1] == eos_id
        out.append(Hypothesis(ids[:-1], 0.0, 0.0))
    return out


@pytest.fixture(scope="module")
def random_model(random_run):
    return load_model(random_run)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=lines_strategy)
def test_translate_lines_keeps_order_and_splits_long_lines(lines, random_model, monkeypatch):
    """With a copying search, line i's output is exactly the round trip of line i: nothing is lost,
    reordered or merged, lines longer than the positional table (31 tokens here) come back whole."""
    monkeypatch.setattr(translation, "greedy_search", identity_search)
    model, vocab, _ = random_model
    hyps = translate_lines(model, vocab, lines, DecodeOptions(beam=1, max_tokens=64))
    assert len(hyps) == len(lines)
    for line, hyp in zip(lines, hyps):
        clean = normalize_line(line)
        expected = normalize_line(vocab.decode(vocab.encode([clean]))[0]) if clean else ""
        assert hyp == expected
        assert not any(c in hyp for c in "\n\r\t\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=lines_strategy, beam=st.sampled_from([1, 2]))
def test_translate_cli_gives_one_line_per_input_line(lines, beam, random_run, tmp_path_factory):
    """translate.py with a random-weight model (it emits byte pieces such as <0x0A> at random): exactly one
    output line per input line, blank for blank, none containing a line break."""
    folder = tmp_path_factory.mktemp("cli")
    src, out = folder / "in.txt", folder / "out.txt"
    src.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    code = translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out), "--beam", str(beam),
                           "--max-len-b", "4", "--max-tokens", "200"])
    assert code == 0
    data = out.read_bytes().decode("utf-8")
    assert data.count("\n") == len(lines) and (data == "" or data.endswith("\n"))
    hyps = data.split("\n")[:-1]
    for line, hyp in zip(lines, hyps):
        if normalize_line(line) == "":
            assert hyp == "", (line, hyp)
        assert hyp == normalize_line(hyp)  # no tabs, no line separators, no runs of whitespace
        assert not any(c in hyp for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    assert not list(folder.glob(".*.tmp"))  # the atomic output left no temporary file


def test_translate_stdin_end_to_end(random_run):
    lines = ["Hello world.", "", "  ", "a\x0cb\x0bc\x1cd\x85e\u2028f\u2029g", "😀 emoji", "tab\there",
             "Привет 你好 مرحبا", "x" * 3000, "\x00\x07", "crlf"]
    data = "\n".join(lines[:-1]).encode("utf-8") + b"\n" + b"crlf\r\n"
    out = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(random_run), "--nbest", "2",
                          "--beam", "2", "--max-len-b", "3"], input=data, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("utf-8")
    rows = text.split("\n")
    assert rows[-1] == "" and len(rows) - 1 == len(lines)
    for line, row in zip(lines, rows):
        cells = row.split("\t")
        assert len(cells) == 2  # --nbest 2: two tab-separated candidates
        if not normalize_line(line):
            assert cells == ["", ""]
    assert out.stderr.decode().count("\n") == 1 and "translated 10 lines" in out.stderr.decode()


def test_empty_input_gives_empty_output(random_run, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"")
    assert translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out)]) == 0
    assert out.read_bytes() == b""
    src.write_bytes(b"\n\n\n")
    assert translate.main(["--model", str(random_run), "--input", str(src), "--output", str(out)]) == 0
    assert out.read_bytes() == b"\n\n\n"


def test_byte_pieces_cannot_break_lines(random_model, monkeypatch):
    """A vocabulary with byte fallback can decode to '\\n' or '\\t': outputs are cleaned like inputs."""
    model, vocab, _ = random_model
    bad = [vocab.piece_to_id(p) for p in ("<0x0A>", "<0x09>", "<0x0D>", "<0x0B>")]

    def search(model, src, bos_id, eos_id, *a, **k):
        return [Hypothesis(bad + [vocab.piece_to_id("▁the")] + bad, 0.0, 0.0) for _ in range(src.shape[0])]

    monkeypatch.setattr(translation, "greedy_search", search)
    assert translate_lines(model, vocab, ["one", "", "two"], DecodeOptions(beam=1)) == ["the", "", "the"]


# -- long lines ------------------------------------------------------------------------------------------
def test_split_long_cuts_at_word_starts_within_the_limit():
    word_start = np.array([False, True, False, False])  # id 1 starts a word, ids 2 and 3 continue one
    ids = [1, 2, 2, 1, 3, 1, 2, 2, 2, 1]
    assert split_long(ids, 10, word_start) == [ids]
    pieces = split_long(ids, 4, word_start)
    assert pieces == [[1, 2, 2], [1, 3], [1, 2, 2, 2], [1]]
    assert all(len(p) <= 4 for p in pieces) and sum(pieces, []) == ids
    assert split_long([2] * 9, 4, word_start) == [[2] * 4, [2] * 4, [2]]  # one long word: cut at the limit
    assert split_long([2] * 9, 4) == [[2] * 4, [2] * 4, [2]]


def test_lines_up_to_the_table_are_translated_whole(random_model, monkeypatch):
    model, vocab, _ = random_model
    seen = []

    def search(model, src, bos_id, eos_id, *a, **k):
        seen.extend(int((row != 0).sum()) for row in np.asarray(src))
        return identity_search(model, src, bos_id, eos_id)

    monkeypatch.setattr(translation, "greedy_search", search)
    limit = model.cfg.max_len - 1
    extra = len(vocab.encode(["x"])[0]) - 1  # 'x' is not in the vocabulary: one byte piece per x, and a '▁'
    for n in (limit, limit + 1, 3 * limit + 5):
        seen.clear()
        line = "x" * (n - extra)
        assert len(vocab.encode([line])[0]) == n
        out = translate_lines(model, vocab, [line], DecodeOptions(beam=1))
        assert out == [line]
        if n <= limit:
            assert seen == [n + 1]  # one piece, with its EOS: nothing cut
        else:
            assert len(seen) == -(-n // limit) and max(seen) <= model.cfg.max_len


def test_output_length_never_exceeds_the_positional_table(random_model, monkeypatch):
    """A budget a*n+b beyond the table is capped (it used to raise deep inside the decoder): every
    hypothesis has at most max_len - 1 tokens before its EOS (the EOS takes the last position), and the
    random model, which rarely ends on its own, reaches exactly that cap."""
    model, vocab, _ = random_model
    lengths = []

    def recording(search, nested):
        def run(*args, **kwargs):
            result = search(*args, **kwargs)
            lengths.extend(len(h.tokens) for hyps in result for h in (hyps if nested else [hyps]))
            return result
        return run

    monkeypatch.setattr(translation, "greedy_search", recording(translation.greedy_search, False))
    monkeypatch.setattr(translation, "beam_search", recording(translation.beam_search, True))
    line = " ".join(["the"] * 40)
    cap = model.cfg.max_len - 1  # 31 here, while the budget asks for 3 * 41 + 200 tokens
    for beam in (1, 3):
        lengths.clear()
        out = translate_lines(model, vocab, [line, "", "Jesus wept."],
                              DecodeOptions(beam=beam, max_len_a=3.0, max_len_b=200))
        assert len(out) == 3 and out[1] == ""
        assert lengths and max(lengths) == cap, (beam, lengths)
