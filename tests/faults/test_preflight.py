"""The fault suite's row "preflight": every command checks its outputs before its first long step
(numformer.cli.preflight.check_output).

A file a run folder needs (its vocabulary, run.json, its metrics log, its checkpoints) is never an output of
another command; an existing folder where a file goes, a file where a folder goes and a place that cannot be
written are refused in one line, exit 2, before the model is loaded, the translation run or the study started.
"""
import os
import tempfile
from pathlib import Path

import pytest

from support import assert_one_line_error, run_main

import translate
from numformer import studies
from numformer.attention_maps import main as attention_main
from numformer.checkpoint import trained_model
from numformer.checkpoint_command import main as checkpoint_main
from numformer.studies.__main__ import main as studies_main


def unwritable_folder(tmp_path) -> Path:
    """A folder no file can be created in: a read-only one, or for root (whom permissions do not stop) /sys."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
    else:
        folder = Path("/sys")
    try:
        os.close(tempfile.mkstemp(dir=folder)[0])
    except OSError:
        return folder
    pytest.fail(f"{folder} takes files on this machine: the test needs a folder that does not")


@pytest.fixture
def never_translates(monkeypatch):
    """translate.py's decoding replaced by a recorder: the test sees whether any translation started."""
    calls = []
    monkeypatch.setattr(translate, "translate_lines", lambda *a, **k: calls.append(a) or [])
    return calls


@pytest.mark.parametrize("name", ["spm.model", "run.json", "metrics.jsonl", "checkpoints/step_0000006.npz"])
def test_translate_never_writes_over_a_file_the_run_folder_needs(name, run_copy, tmp_path, capsys,
                                                                never_translates):
    (tmp_path / "in.txt").write_text("a b c\n")
    target = run_copy / name
    before = target.read_bytes()
    code, _, err = run_main(translate.main, ["--model", str(run_copy), "--input", str(tmp_path / "in.txt"),
                                             "--output", str(target)], capsys)
    assert_one_line_error(code, err, "translate.py", "which the run needs")
    assert target.read_bytes() == before
    assert never_translates == []


def test_average_never_writes_into_the_run_s_checkpoints(run_copy, capsys):
    target = run_copy / "checkpoints" / "step_0000007.npz"
    code, _, err = run_main(checkpoint_main, ["average", "--last", "2", str(run_copy), "--out", str(target)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "checkpoints of the run folder")
    assert not target.exists()


def test_translate_refuses_a_folder_as_output_before_translating(copy_run, tmp_path, capsys, never_translates):
    (tmp_path / "in.txt").write_text("a b c\n")
    (tmp_path / "out").mkdir()
    code, _, err = run_main(translate.main, ["--model", str(copy_run), "--input", str(tmp_path / "in.txt"),
                                             "--output", str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "translate.py", "is a folder: give a file path")
    assert never_translates == []


def test_attention_maps_refuses_a_file_where_a_folder_goes_before_loading_the_model(copy_run, tmp_path, capsys,
                                                                                   monkeypatch):
    loaded = []
    monkeypatch.setattr(trained_model, "load_model", lambda *a, **k: loaded.append(a))
    (tmp_path / "plain").write_text("a file")
    code, _, err = run_main(attention_main, ["--model", str(copy_run), "--sentence", "a b",
                                             "--out", str(tmp_path / "plain" / "att.png")], capsys)
    assert_one_line_error(code, err, "python -m numformer.attention_maps", "is a file, where a folder goes")
    assert loaded == []


def test_a_study_refuses_an_unwritable_place_before_it_runs(tmp_path, capsys, monkeypatch):
    ran = []
    study = studies.get("ln-placement")
    monkeypatch.setattr(study, "run", lambda *a, **k: ran.append(a))
    out = unwritable_folder(tmp_path) / "numformer-study"
    code, _, err = run_main(studies_main, ["ln-placement", "--small", "--out", str(out)], capsys)
    assert_one_line_error(code, err, "python -m numformer.studies", "cannot write in")
    assert ran == []


def test_export_refuses_an_unwritable_place_before_reading_the_model(copy_run, tmp_path, capsys, monkeypatch):
    from numformer import checkpoint_command  # noqa: PLC0415

    exported = []
    monkeypatch.setattr(checkpoint_command, "export_model", lambda *a, **k: exported.append(a))
    out = unwritable_folder(tmp_path) / "numformer-export" / "m.npz"
    code, _, err = run_main(checkpoint_main, ["export", str(copy_run), "--out", str(out)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "cannot write in")
    assert exported == []
