"""One line for every mistake (numformer.cli.one_line_errors.one_line_errors): bad training data, bad flags, damaged or missing
models and vocabularies get one line on stderr naming the problem and what to do, exit status 2, no
traceback; a bug of numformer's says it is a bug and where its traceback went, exit status 1."""
import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest

import train
import translate
from numformer.checkpoint import load_checkpoint, save_checkpoint
from numformer.checkpoint.trained_model import load_model
from numformer.data import SubwordVocab
from numformer.errors import NumformerError, UsageError
from numformer.training.trainer import Trainer
from support import (ROOT, TEXT, VOCAB_SIZE, assert_one_line_error, copy_args, corrupt, cuda_available,
                     make_random_run, run_main, write_corpus)


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
    "zero steps": (["--task", "copy", "--max-steps", "0"], "--max-steps: must be an integer from 1 to 2147483647"),
    "negative tokens": (["--task", "copy", "--max-tokens", "-5"], "an integer from 1 to"),
    "not a number": (["--task", "copy", "--max-minutes", "soon"], "expected a number"),
    "nan minutes": (["--task", "copy", "--max-minutes", "nan"], "in (0, 1e+06]"),
    "dropout of 1.5": (["--task", "copy", "--dropout", "1.5"], "in [0, 1)"),
    "negative clip": (["--task", "copy", "--clip-norm", "-1"], "in [0, 1e+12]"),
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


CHECKPOINT_CASES = {
    "truncated": "truncated or corrupt",
    "junk": "is a text file, not a model",  # a whole file of another kind is named, never called corrupt
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
        (["--model", str(copy_run), "--beam", "0"], "an integer from 1 to 1024"),
        (["--model", str(copy_run), "--max-len-b", "-1"], "an integer from 0 to 1048576"),
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


def test_bad_utf8_on_standard_input_names_the_line(copy_run):
    out = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(copy_run)],
                         input=b"a b\nc d\ne \xff f\n", capture_output=True)
    err = out.stderr.decode()
    assert out.returncode == 2 and "Traceback" not in err and out.stdout == b""
    assert err.strip().count("\n") == 0
    assert "standard input line 3 is not valid UTF-8" in err


def test_user_errors_are_the_projects_own_classes():
    assert not issubclass(ValueError, NumformerError) and not issubclass(OSError, NumformerError)
    assert issubclass(UsageError, NumformerError)


def bug_report(err, prog):
    """The one line a bug prints -> the crash log it names (checked to hold the traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: internal error (a bug in numformer") and "please report it" in lines[0]
    log = Path(re.search(r"the traceback is in (\S+):", lines[0]).group(1))
    text = log.read_text()
    assert "Traceback (most recent call last)" in text
    return log, text


@pytest.mark.parametrize("exc", [ValueError("operands could not be broadcast together with shapes (3,) (4,)"),
                                 OSError(errno.EBADF, "Bad file descriptor")], ids=["ValueError", "OSError"])
def test_a_bug_in_translate_says_so_and_where_the_traceback_is(exc, tmp_path, monkeypatch, capsys):
    run = make_random_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("a b c\n")

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(translate, "translate_lines", broken)
    code, out, err = run_main(translate.main, ["--model", str(run), "--input", str(tmp_path / "in.txt")], capsys)
    assert code == 1 and out == ""
    log, text = bug_report(err, "translate.py")
    assert type(exc).__name__ in text and "in broken" in text
    log.unlink()


def test_a_bug_in_training_writes_run_crash_log(tmp_path, monkeypatch, capsys):
    def broken(self, *args, **kwargs):
        raise ValueError("shapes (2,3) and (4,5) not aligned")

    monkeypatch.setattr(Trainer, "train_step", broken)
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out), capsys)
    assert code == 1
    log, text = bug_report(err, "train.py")
    assert log == out / "crash.log" and "not aligned" in text


def test_a_full_disk_is_still_one_line(tmp_path, monkeypatch, capsys):
    run = make_random_run(tmp_path / "run")
    (tmp_path / "in.txt").write_text("a b c\n")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(translate, "translate_lines", full)
    code, out, err = run_main(translate.main, ["--model", str(run), "--input", str(tmp_path / "in.txt")], capsys)
    assert code == 2
    assert_one_line_error(code, err, "translate.py", "no space left on device")


@pytest.mark.parametrize("value, needle", [("-1", "must be an integer from 0 to 2147483647, got -1"), ("x", "expected an integer")])
def test_log_grads_is_checked_when_parsed(value, needle, capsys):
    with pytest.raises(SystemExit) as done:
        train.parse_args(["--task", "copy", "--log-grads", value])
    assert done.value.code == 2
    assert_one_line_error(done.value.code, capsys.readouterr().err, "train.py", needle)


def test_cli_errors_are_one_line(tmp_path):
    cases = [
        (["translate.py", "--model", str(tmp_path / "nope")], "does not exist"),
        (["train.py", "--corpus", "klingon", "--max-steps", "1", "--out", str(tmp_path / "k")], "unknown corpus"),
        (["train.py", "--task", "copy", "--device", "cuda", "--out", str(tmp_path / "c")], "cupy"),
        (["train.py", "--data", str(tmp_path / "missing"), "--max-steps", "1", "--out", str(tmp_path / "m")], "missing"),
    ]
    for argv, needle in cases:
        out = subprocess.run([sys.executable, str(ROOT / argv[0])] + argv[1:], capture_output=True, text=True)
        assert out.returncode == 2, (argv, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, (argv, out.stderr)  # the error is the only line, and it names the problem
        assert lines[0].startswith(f"{argv[0]}: error:") and needle in lines[0].lower(), (argv, out.stderr)
