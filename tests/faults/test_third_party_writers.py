"""Every write through the atomic writer, a third-party library's included, and one writer per output (issue 59).

At 32b7b89 sentencepiece's trainer wrote ``spm.model`` in place (a kill during preparation left a cut model
under its real name, which the same command then refused), and two processes writing one output were not told
apart: a second export into a folder another was filling succeeded, and the first then failed with a bug
report; two commands writing one file both went ahead."""
import subprocess
import sys
import time

import pytest

import translate
from numformer.checkpoint_command import main as checkpoint_main
from numformer.data import vocab as vocab_module
from numformer.data.vocab import SubwordVocab
from numformer.errors import NumformerError
from numformer.files import atomic_folder
from support import ROOT, TEXT, assert_one_line_error, run_main

OLD = b"old bytes: never lost\n"


def test_a_sentencepiece_model_cut_by_an_interruption_never_takes_the_models_name(tmp_path, monkeypatch):
    (tmp_path / "spm.model").write_bytes(OLD)
    trainer = vocab_module.sentencepiece_module().SentencePieceTrainer

    def cut_short(model_prefix, **_):  # the trainer has written half its model when Ctrl-C comes
        with open(f"{model_prefix}.model", "wb") as f:
            f.write(b"\x0a\x05half")
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", cut_short)
    with pytest.raises(KeyboardInterrupt):
        SubwordVocab.train(TEXT, tmp_path / "spm", 100)
    assert (tmp_path / "spm.model").read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model"]  # nothing else left behind


def test_sentencepiece_trains_beside_its_target_under_a_partial_name(tmp_path, monkeypatch):
    trainer = vocab_module.sentencepiece_module().SentencePieceTrainer
    real, prefixes = trainer.train, []
    monkeypatch.setattr(trainer, "train", lambda **kw: (prefixes.append(kw["model_prefix"]), real(**kw))[1])
    vocab = SubwordVocab.train(TEXT, tmp_path / "spm", 100)
    assert prefixes and all(".spm.model.numformer-partial-" in p and str(tmp_path) in p for p in prefixes), prefixes
    assert vocab.path == tmp_path / "spm.model" and (tmp_path / "spm.vocab").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "spm.vocab"]


HOLDER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from numformer.files import atomic_file, atomic_folder
target, started, release = (Path(a) for a in sys.argv[1:4])
def wait():
    started.write_text("writing")
    while not release.exists():
        time.sleep(0.05)
if sys.argv[4] == "folder":
    atomic_folder(target, lambda stage: (wait(), (stage / "first.txt").write_text("the first writer's")))
else:
    with atomic_file(target) as f:
        wait()
        f.write(b"the first writer's\n")
"""


@pytest.fixture
def first_writer(tmp_path):
    """start(target, kind): another process writing ``target`` (a "folder" or a "file") through numformer.files,
    held mid-write until the test ends; -> its Popen."""
    procs = []

    def start(target, kind):
        started, release = tmp_path / f"started-{len(procs)}", tmp_path / f"release-{len(procs)}"
        proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(target), str(started),
                                 str(release), kind], stderr=subprocess.PIPE, text=True)
        procs.append((proc, release))
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        return proc

    yield start
    for proc, release in procs:
        release.write_text("go")
        proc.wait(timeout=60)


def test_a_second_export_into_a_folder_being_written_is_one_line(copy_run, tmp_path, first_writer, capsys):
    out = tmp_path / "hf"
    first = first_writer(out, "folder")
    code, _, err = run_main(checkpoint_main, ["export", str(copy_run), "--format", "hf", "--out", str(out)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint",
                          f"{out} is being written by another process (PID {first.pid})")
    (tmp_path / "release-0").write_text("go")
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert sorted(p.name for p in out.iterdir()) == ["first.txt"]  # the first writer's folder, whole, unmixed


def test_a_second_command_writing_a_file_being_written_is_one_line(copy_run, tmp_path, first_writer, capsys):
    text, out = tmp_path / "in.txt", tmp_path / "hyp.txt"
    text.write_text("a b c\n", encoding="utf-8")
    first = first_writer(out, "file")
    code, _, err = run_main(translate.main, ["--model", str(copy_run), "--input", str(text), "--output", str(out),
                                             "--greedy"], capsys)
    assert_one_line_error(code, err, "translate.py", f"is being written by another process (PID {first.pid})")
    (tmp_path / "release-0").write_text("go")
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert out.read_text() == "the first writer's\n"


def test_a_folder_filled_by_another_writer_meanwhile_is_kept_and_the_write_refused(tmp_path):
    out = tmp_path / "ct2"

    def fill(stage):  # while this writer stages, another one finishes first
        (stage / "model.bin").write_bytes(b"mine")
        out.mkdir()
        (out / "model.bin").write_bytes(b"theirs")

    with pytest.raises(NumformerError, match="was written by another process while this one worked"):
        atomic_folder(out, fill)
    assert (out / "model.bin").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
