"""The fault suite's row "file kinds": a path given to a command is named as what it is (numformer.file_kinds).

A whole file of another kind given where a model goes (a text file, the run's vocabulary, its metrics log, a
transformers weights file, a PyTorch file) is said to be that, with what to give instead, by every command
that takes a model; never "truncated or corrupt: use an earlier checkpoint". A folder where a file goes is
said to be a folder; ``-`` is standard input or output; a path holding a control character is printed quoted,
so the message stays one line.
"""
import io
import json
import struct
import sys
import zipfile

import numpy as np
import pytest

from support import assert_one_line_error, run_main

import train
import translate
from grad_checks.__main__ import main as grad_checks_main
from numformer.attention_maps import main as attention_main
from numformer.checkpoint_command import main as checkpoint_main
from numformer.plot import main as plot_main


def written(path, data):
    """``path`` after writing ``data`` (text or bytes) to it."""
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def write_transformers_weights(path):
    """A safetensors file as transformers' save_pretrained writes it: tensors, no numformer metadata."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "__metadata__": {"format": "pt"}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.zeros(2, np.float32).tobytes())
    return path


def write_pytorch_zip(path):
    """The layout torch.save writes (a zip whose first member is ``archive/data.pkl``), without torch."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
    return path


# name -> (how to make it from the run folder and a scratch folder, what the line must say it is)
WRONG_MODELS = {
    "text file": (lambda run, tmp: written(tmp / "notes.txt", "one two\nthree\n"),
                  "is a text file, not a model"),
    "vocabulary": (lambda run, tmp: run / "spm.model", "is a sentencepiece model"),
    "metrics log": (lambda run, tmp: run / "metrics.jsonl", "is a metrics log, not a model"),
    "transformers weights": (lambda run, tmp: write_transformers_weights(tmp / "model.safetensors"),
                             "transformers weights file"),
    "pytorch file": (lambda run, tmp: write_pytorch_zip(tmp / "model.pt"), "is a PyTorch file"),
}


@pytest.mark.parametrize("case", list(WRONG_MODELS))
def test_translate_names_a_whole_file_of_another_kind_instead_of_calling_it_corrupt(case, copy_run, tmp_path,
                                                                                     capsys):
    make, said = WRONG_MODELS[case]
    model = make(copy_run, tmp_path)
    (tmp_path / "in.txt").write_text("a b c\n")
    code, out, err = run_main(translate.main, ["--model", str(model), "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_line_error(code, err, "translate.py", said)
    assert "corrupt" not in err and "earlier checkpoint" not in err
    assert out == ""


COMMANDS = {
    "export": (checkpoint_main, "python -m numformer.checkpoint", lambda m, tmp: ["export", str(m), "--out",
                                                                                 str(tmp / "m.npz")]),
    "average": (checkpoint_main, "python -m numformer.checkpoint",
                lambda m, tmp: ["average", str(m), str(m), "--out", str(tmp / "avg.npz")]),
    "grad_checks --checkpoint": (grad_checks_main, "python -m grad_checks",
                                 lambda m, tmp: ["--checkpoint", str(m), "--layer", "Linear"]),
    "attention_maps": (attention_main, "python -m numformer.attention_maps",
                       lambda m, tmp: ["--model", str(m), "--sentence", "a b", "--out", str(tmp / "a.png")]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_that_takes_a_model_names_a_metrics_log_as_one(command, copy_run, tmp_path, capsys):
    main, prog, argv = COMMANDS[command]
    code, _, err = run_main(main, argv(copy_run / "metrics.jsonl", tmp_path), capsys)
    assert_one_line_error(code, err, prog, "is a metrics log, not a model: give a run folder or a .npz model file")
    assert not list(tmp_path.iterdir())


# name -> (how to make it, the name of its kind in numformer.file_kinds)
KINDS = {
    "run folder": (lambda run, tmp: run, "RUN_FOLDER"),
    "checkpoint": (lambda run, tmp: run / "checkpoints" / "step_0000006.npz", "MODEL_FILE"),
    "vocabulary": (lambda run, tmp: run / "spm.model", "SENTENCEPIECE"),
    "metrics log": (lambda run, tmp: run / "metrics.jsonl", "METRICS_LOG"),
    "run settings": (lambda run, tmp: run / "run.json", "RUN_SETTINGS"),
    "transformers weights": (lambda run, tmp: write_transformers_weights(tmp / "w.safetensors"),
                             "HF_WEIGHTS"),
    "pytorch zip": (lambda run, tmp: write_pytorch_zip(tmp / "m.pt"), "PYTORCH"),
    "pytorch pickle": (lambda run, tmp: written(tmp / "m.bin", b"\x80\x02}q\x00."),
                       "PYTORCH"),
    "text": (lambda run, tmp: written(tmp / "t.txt", "hello\n"), "TEXT"),
    "nothing": (lambda run, tmp: tmp / "nope", "MISSING"),
    "other folder": (lambda run, tmp: tmp, "FOLDER"),
}


@pytest.mark.parametrize("case", list(KINDS))
def test_kind_of_tells_each_kind_from_name_and_first_bytes(case, copy_run, tmp_path):
    from numformer import file_kinds  # noqa: PLC0415  (here: each test fails on its own where it is missing)

    make, kind = KINDS[case]
    assert file_kinds.kind_of(make(copy_run, tmp_path)) == getattr(file_kinds, kind)


def test_kind_of_tells_transformers_and_ctranslate2_folders(tmp_path):
    from numformer import file_kinds  # noqa: PLC0415

    hf, ct2 = tmp_path / "hf", tmp_path / "ct2"
    hf.mkdir()
    ct2.mkdir()
    (hf / "config.json").write_text("{}")
    write_transformers_weights(hf / "model.safetensors")
    (ct2 / "config.json").write_text("{}")
    (ct2 / "model.bin").write_bytes(b"\x06\x00\x00\x00" + bytes(60))
    assert file_kinds.kind_of(hf) == file_kinds.HF_FOLDER
    assert file_kinds.kind_of(ct2) == file_kinds.CT2_FOLDER


@pytest.mark.parametrize("flag", ["--input", "--vocab"])
def test_a_folder_given_where_a_file_goes_is_said_to_be_a_folder(flag, copy_run, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("a b c\n")
    argv = ["--model", str(copy_run), "--input", str(tmp_path / "in.txt"), flag, str(tmp_path / "folder")]
    (tmp_path / "folder").mkdir()
    code, out, err = run_main(translate.main, argv, capsys)
    assert_one_line_error(code, err, "translate.py", "is a folder: give a file")
    assert out == ""


def test_dash_is_standard_input_and_standard_output(copy_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\nd e\n")))
    code, out, err = run_main(translate.main, ["--model", str(copy_run), "--input", "-", "--output", "-",
                                               "--greedy"], capsys)
    assert code == 0, err
    assert len(out.splitlines()) == 2
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("char", ["\n", "\t", "\x1b"], ids=["line break", "tab", "escape"])
def test_a_path_with_a_control_character_is_printed_quoted_on_one_line(char, tmp_path, capsys):
    model = tmp_path / f"x{char}y.npz"
    (tmp_path / "in.txt").write_text("a b c\n")
    code, _, err = run_main(translate.main, ["--model", str(model), "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_line_error(code, err, "translate.py", repr(str(model)))
    assert char not in err.rstrip("\n")


# -- train.py --data and checkpoint import given a path of another kind; an empty positional path -------------------

# name -> (the path, from the run folder and a scratch folder)
NOT_CORPORA = {
    "text file": lambda run, tmp: written(tmp / "train.txt", "one two\nthree\n"),
    "model file": lambda run, tmp: run / "checkpoints" / "step_0000006.npz",
    "run folder": lambda run, tmp: run,
    "metrics log": lambda run, tmp: run / "metrics.jsonl",
}
SAID = {"text file": "is a text file", "model file": "is a numformer model file",
        "run folder": "is a numformer run folder", "metrics log": "is a metrics log"}


@pytest.mark.parametrize("case", list(NOT_CORPORA))
def test_train_data_of_another_kind_is_named_before_anything_is_created(case, copy_run, tmp_path, capsys):
    """train.py --data takes a corpus folder: a file, a model or a run folder is named as what it is, with what to
    give, and the run folder is not created."""
    path, out = NOT_CORPORA[case](copy_run, tmp_path), tmp_path / "new-run"
    code, _, err = run_main(train.main, ["--data", str(path), "--preset", "tiny", "--max-steps", "1", "--out", str(out),
                                         "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py",
                          f"{path} {SAID[case]}, not a corpus folder: give the folder that holds")
    assert not out.exists()


@pytest.mark.parametrize("case", ["text file", "model file", "run folder", "metrics log"])
def test_import_names_a_local_path_of_another_kind(case, copy_run, tmp_path, capsys):
    """``checkpoint import SOURCE`` reads a Hugging Face Marian folder: a local path of another kind is named as
    what it is (a numformer model needs no import), and nothing is written."""
    path, out = NOT_CORPORA[case](copy_run, tmp_path), tmp_path / "imported.npz"
    code, _, err = run_main(checkpoint_main, ["import", str(path), "--out", str(out)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", f"{path} {SAID[case]}")
    assert ("already: nothing to import" if case in ("model file", "run folder") else
            "not a Hugging Face Marian model") in err
    assert not out.exists()


EMPTY_POSITIONALS = {
    "plot ''": (lambda: plot_main, "python -m numformer.plot", [""]),
    "export ''": (lambda: checkpoint_main, "python -m numformer.checkpoint export", ["export", "", "--out", "OUT"]),
    "average '' ' '": (lambda: checkpoint_main, "python -m numformer.checkpoint average",
                       ["average", "", " ", "--out", "OUT"]),
    "import ''": (lambda: checkpoint_main, "python -m numformer.checkpoint import", ["import", "", "--out", "OUT"]),
    "grad_checks check ''": (lambda: grad_checks_main, "python -m grad_checks check", ["check", ""]),
}


@pytest.mark.parametrize("case", list(EMPTY_POSITIONALS))
def test_an_empty_positional_path_is_one_line(case, tmp_path, monkeypatch, capsys):
    """An empty or blank positional path (an unset shell variable) is refused as the path flags are: one line, exit 2,
    nothing read as the current folder and nothing written."""
    main, prog, argv = EMPTY_POSITIONALS[case]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.npz"
    code, _, err = run_main(main(), [str(out) if word == "OUT" else word for word in argv], capsys)
    assert_one_line_error(code, err, prog, "an empty path (an unset shell variable?)")
    assert sorted(tmp_path.iterdir()) == []
