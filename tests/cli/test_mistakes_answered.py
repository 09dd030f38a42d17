"""The mistakes a new user made with the model-file commands (issue 40), each answered in one line that says
what to do, exit 2, and nothing written: the format and the path disagreeing, ``average``'s run-folder slips,
a Hugging Face folder given where a numformer model goes, and a refused training run leaving its --out as it
found it."""
import json

import pytest

import train
import translate
from grad_checks.__main__ import main as grad_checks_main
from numformer.checkpoint_command import main
from support import assert_one_line_error, copy_args, run_main

PROG = "python -m numformer.checkpoint"


def checkpoint(run):
    return run / "checkpoints" / "step_0000006.npz"


@pytest.fixture
def hf_folder(tmp_path):
    """What MarianMTModel.save_pretrained leaves (the names are what is recognised; the contents are not read)."""
    folder = tmp_path / "opus-mt-en-de"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "marian"}), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    return folder


def test_a_bad_format_is_one_line_not_a_usage_block(copy_run, tmp_path, capsys):
    code, _, err = run_main(main, ["export", str(copy_run), "--format", "onnx", "--out", str(tmp_path / "m")], capsys)
    assert_one_line_error(code, err, f"{PROG} export", "invalid choice: 'onnx'")


def test_average_last_below_one_says_what_it_must_be(copy_run, tmp_path, capsys):
    code, _, err = run_main(main, ["average", "--last", "-1", str(copy_run), "--out", str(tmp_path / "a.npz")],
                            capsys)
    assert_one_line_error(code, err, f"{PROG} average", "--last: must be an integer from 1 to 2147483647, got -1")


def test_average_of_a_run_folder_without_last_names_the_flag(copy_run, tmp_path, capsys):
    code, _, err = run_main(main, ["average", str(copy_run), "--out", str(tmp_path / "a.npz")], capsys)
    assert_one_line_error(code, err, PROG, f"{copy_run} is a folder: give checkpoint files, or --last N")
    assert not (tmp_path / "a.npz").exists()


def test_import_into_a_safetensors_name_is_refused_not_written_as_npz(hf_folder, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    code, _, err = run_main(main, ["import", str(hf_folder), "--out", str(out)], capsys)
    assert_one_line_error(code, err, PROG, "name a file ending .npz")
    assert not out.exists()


def test_a_one_file_format_into_a_folder_path_is_refused(copy_run, tmp_path, capsys):
    folder = tmp_path / "models"
    code, _, err = run_main(main, ["export", str(copy_run), "--format", "safetensors", "--out", f"{folder}/"], capsys)
    assert_one_line_error(code, err, PROG, f"e.g. {folder / 'model.safetensors'}")
    assert not folder.exists()


@pytest.mark.parametrize("suffix,fmt", [(".npz", "safetensors"), (".safetensors", "npz"), ("", "npz")])
def test_the_format_follows_the_suffix_or_is_refused(copy_run, tmp_path, capsys, suffix, fmt):
    out = tmp_path / f"model{suffix}"
    code, _, err = run_main(main, ["export", str(copy_run), "--format", fmt, "--out", str(out)], capsys)
    assert_one_line_error(code, err, PROG, f"name it {out.with_suffix('.' + fmt)}")
    assert not out.exists()


def test_a_folder_format_into_a_full_folder_is_refused_before_anything_is_written(copy_run, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    code, _, err = run_main(main, ["export", str(copy_run), "--format", "hf", "--out", str(full)], capsys)
    assert_one_line_error(code, err, PROG, "is a folder that is not empty: give a new or empty folder")
    assert sorted(p.name for p in full.iterdir()) == ["notes.txt"]


def import_line(folder):
    return f"python -m numformer.checkpoint import {folder} --out {folder.name}.npz"


def test_translate_given_a_hugging_face_folder_names_the_import(hf_folder, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("hello\n")
    code, _, err = run_main(translate.main, ["--model", str(hf_folder), "--input", str(tmp_path / "in.txt")], capsys)
    assert_one_line_error(code, err, "translate.py", import_line(hf_folder))


def test_grad_checks_given_a_hugging_face_folder_names_the_import(hf_folder, capsys):
    code, _, err = run_main(grad_checks_main, ["--checkpoint", str(hf_folder), "--layer", "Linear"], capsys)
    assert code == 2, err
    assert import_line(hf_folder) in err and "Traceback" not in err


def test_fine_tuning_from_a_hugging_face_folder_names_the_import_and_leaves_no_run_folder(hf_folder, tmp_path,
                                                                                           capsys):
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out, 2, "--init-from", str(hf_folder)), capsys)
    assert_one_line_error(code, err, "train.py", import_line(hf_folder))
    assert not out.exists()  # refused: no run.lock, no prepared corpus, no folder


def test_a_refused_run_in_an_existing_folder_removes_only_what_it_created(hf_folder, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = run_main(train.main, copy_args(out, 2, "--init-from", str(hf_folder)), capsys)
    assert code == 2, err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("where, said", [("a file", "is a file: give a folder"),
                                         ("under a file", "is a file, where a folder goes")])
def test_an_output_folder_that_is_a_file_is_one_line_not_a_bug(copy_run, tmp_path, capsys, where, said):
    from numformer.plot import main as plot_main

    file = tmp_path / "notes.txt"
    file.write_text("mine")
    out = file if where == "a file" else file / "plots"
    code, _, err = run_main(plot_main, [str(copy_run), "--out", str(out)], capsys)
    assert_one_line_error(code, err, "python -m numformer.plot", said)
    assert file.read_text() == "mine"


def test_a_pytorch_weights_file_of_random_bytes_is_one_line_without_torchs_advice(copy_run, tmp_path, capsys):
    pytest.importorskip("torch")  # a pytorch_model.bin is read through torch (installed by .ci/setup)
    folder = tmp_path / "hf"
    assert main(["export", str(copy_run), "--format", "hf", "--out", str(folder)]) == 0
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(bytes(range(256)) * 64)
    out = tmp_path / "m.npz"
    code, _, err = run_main(main, ["import", str(folder), "--out", str(out)], capsys)
    assert_one_line_error(code, err, PROG, f"{folder / 'pytorch_model.bin'} is not a PyTorch weights file")
    assert "weights_only" not in err
    assert not out.exists()
