"""A student's folder of exercise files: ``exercise --status DIR`` says which check exact, and ``train.py --swap
all=DIR`` builds the model from every layer solved in it. With numformer's own solutions written in as student
files, every layer numformer builds is the student's and the model trains bit for bit like numformer's (plain
kernels), within float32 round-off with the default kernels; a folder holding a file that does not check exact
is refused in one line, before any data is read."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import lab_files
from grad_checks import exercises
from grad_checks.__main__ import main as grad_checks_main
from grad_checks.swap_grading import grade_swap, solved_specs
from numformer import loss as loss_module
from numformer.kernels import kernel_mode
from numformer.activations import ACTIVATIONS
from numformer.layers.registry import layer_class
from numformer.model import Transformer
from numformer.swap import SwapError, swappable, swapped_from_specs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from support import assert_one_line_error, copy_args, run_main  # noqa: E402
from test_swap import CFG, _batches, _train  # noqa: E402


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A folder holding every exercise solved: numformer's reference written into each student file."""
    folder = tmp_path_factory.mktemp("solved")
    for ex in exercises.all_exercises():
        lab_files.write(ex, ex.target, folder)
    return folder


def _copy_of(solved, tmp_path, wrong=None, drop=()):
    """``solved`` copied, with ``wrong`` = (exercise, function) written in instead, and ``drop`` left out."""
    for path in solved.glob("my_*.py"):
        if path.stem[3:] not in drop:
            (tmp_path / path.name).write_text(path.read_text())
    if wrong is not None:
        lab_files.write(exercises.get(wrong[0]), wrong[1], tmp_path)
    return tmp_path


def test_status_lists_every_exercise_exact(solved, capsys):
    assert grad_checks_main(["exercise", "--status", str(solved)]) == 0
    out = capsys.readouterr().out
    for i, name in enumerate(exercises.ORDER, 1):
        assert f"{i:>2}  {name}" in out and f"my_{name}.py" in out
    assert out.count("EXACT") == len(exercises.ORDER)
    assert f"{len(exercises.ORDER)} of {len(exercises.ORDER)} exercises check exact" in out
    assert f"--swap all={solved}" in out


def test_status_says_missing_wrong_and_unwritten(solved, tmp_path, capsys):
    ln = exercises.get("layernorm")
    folder = _copy_of(solved, tmp_path, wrong=("layernorm", ln.mistakes[0]), drop=("relu",))
    (folder / "notes.py").write_text("x = 1\n")  # not an exercise file: listed below the table, with why
    from grad_checks.lab import write_exercise
    (folder / "my_linear.py").unlink()
    write_exercise("linear", str(folder))
    assert grad_checks_main(["exercise", "--status", str(folder)]) == 1
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line[:2].strip().isdigit()}
    assert "missing" in lines["relu"] and "exercise relu --out" in lines["relu"]
    assert "wrong" in lines["layernorm"] and ln.mistakes[0].__name__ in lines["layernorm"]
    assert "not implemented" in lines["linear"]
    assert f"{len(exercises.ORDER) - 3} of {len(exercises.ORDER)} exercises check exact" in out
    assert "notes.py  not an exercise file (no EXERCISE line)" in out


def _one_file_per_reason(folder):
    """A folder with a file for each reason a file is not graded, and the two ways one exercise gets two files."""
    relu, ln = exercises.get("relu"), exercises.get("layernorm")
    for name in ("b_relu.py", "a_relu.py"):  # two answer relu, neither is my_relu.py
        lab_files.write(relu, relu.target, folder).rename(folder / name)
    lab_files.write(ln, ln.mistakes[0], folder).rename(folder / "layernorm_try2.py")  # my_layernorm.py comes first
    lab_files.write(ln, ln.target, folder)
    (folder / "helpers.py").write_text("import numpy as np\n\n\ndef twice(x):\n    return 2 * x\n")
    (folder / "typo.py").write_text('EXERCISE = "layernom"\n')
    (folder / "blob.py").write_bytes(b"\x00\x01binary\x00")
    (folder / "half.py").write_text('EXERCISE = "silu"\n\ndef silu_backward(dy, x:\n')  # the EXERCISE line, no parse
    (folder / "scratch.py").mkdir()  # a folder, not a file: not listed
    return folder


def test_status_lists_every_py_file_with_the_file_graded_or_why_not(tmp_path, capsys):
    folder = _one_file_per_reason(tmp_path)
    assert grad_checks_main(["exercise", "--status", str(folder)]) == 1
    out = capsys.readouterr().out
    dropped = [p.name for p in folder.glob("*.py") if p.is_file() and p.name not in out]
    assert not dropped, f"files the table says nothing of: {dropped}"
    rows = {line.split()[1]: line for line in out.splitlines() if line[:2].strip().isdigit()}
    below = out[out.index("not graded:"):]
    reasons = {line.split()[0]: " ".join(line.split()[1:])
               for line in below.splitlines()[1:] if line.startswith("    ")}
    # every .py file of the folder is in one place: graded in a row, or listed below with its reason
    for path in folder.glob("*.py"):
        if path.is_file():
            assert (path.name in reasons) != any(f"  {path.name}" in row for row in rows.values()), path.name
    assert "scratch.py" not in out
    assert "EXACT" in rows["relu"] and "a_relu.py (1 other file answers it: see below)" in rows["relu"]
    assert reasons["b_relu.py"] == ("two files answer relu and neither is my_relu.py: graded a_relu.py "
                                    "(alphabetically first); rename the one you mean to my_relu.py")
    assert "EXACT" in rows["layernorm"] and "my_layernorm.py (1 other file answers it: see below)" in rows["layernorm"]
    assert reasons["layernorm_try2.py"] == ("also answers layernorm (EXERCISE line); graded my_layernorm.py instead: "
                                            "my_layernorm.py comes first")
    assert reasons["helpers.py"] == "not an exercise file (no EXERCISE line)"
    assert reasons["typo.py"].startswith("names an unknown exercise 'layernom'")
    assert reasons["blob.py"] == "could not be read: a binary file (it holds NUL bytes), not Python source"
    # a file with an EXERCISE line that does not parse answers its exercise: its row says why it does not grade
    assert "error" in rows["silu"] and "half.py" in rows["silu"] and "half.py:3" in rows["silu"]
    assert "half.py" not in reasons and len(reasons) == 5
    assert "not graded: the 5 other .py files in" in out
    # --swap all=DIR refuses this folder (two files answer relu): the table does not suggest it
    assert "--swap all" not in out and "more than one answers relu, layernorm: see above" in out


def test_a_binary_my_name_file_is_graded_as_its_exercise_and_says_why_it_fails(tmp_path, capsys):
    (tmp_path / "my_linear.py").write_bytes(b"\x00\x00")
    grad_checks_main(["exercise", "--status", str(tmp_path)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line[:2].strip() == str(exercises.number("linear")))
    assert "error" in row and "my_linear.py" in row and "null bytes" in row
    assert "not graded" not in out


def test_swap_all_builds_every_layer_from_the_folder_and_trains_bit_for_bit(solved):
    logged = []
    with kernel_mode("plain"):
        ref_losses, ref_state = _train(Transformer(CFG, seed=3), loss_module.LabelSmoothedCrossEntropy(0.1, 0),
                                       _batches())
        with swapped_from_specs([f"all={solved}"], log=logged.append, grade=grade_swap, expand=solved_specs) as swaps:
            model = Transformer(CFG, seed=3)
            crit = layer_class("LabelSmoothedCrossEntropy")(0.1, 0)
        swapped_layers = {ex.swap for ex in exercises.all_exercises() if ex.swap}
        # every exercise swaps its layer but softmax's (no layer) and forward mode's (training runs no jvp)
        backward = [ex for ex in exercises.all_exercises() if ex.mode == "backward"]
        assert set(swaps) == swapped_layers and len(swapped_layers) == len(backward) - 1
        assert logged[0].startswith(f"swap all={solved}: {len(swapped_layers)} layers, every file checks exact")
        assert "softmax" in logged[0]
        numformer, exercise_of = swappable(), {ex.swap: ex.name for ex in exercises.all_exercises() if ex.swap}
        found = set()
        for m in list(model.modules()) + [crit]:
            for name in [n for n, c in numformer.items() if isinstance(m, c) and n in swapped_layers]:
                # every layer the model holds that a student wrote comes from the student's file
                assert Path(sys.modules[type(m).__module__].__file__) == solved / f"my_{exercise_of[name]}.py"
                found.add(name)
        # and every one of them is used, but the activations CFG's feed-forward network does not build (it builds one
        # of the table's: ModelConfig.activation)
        assert found == swapped_layers - {row.layer for row in ACTIVATIONS.values() if row.name != CFG.activation}
        losses, state = _train(model, crit, _batches())
    assert losses == ref_losses
    assert all(np.array_equal(state[k], ref_state[k]) for k in ref_state)


def test_swap_all_with_default_kernels_trains_within_float32_noise(solved):
    ref_losses, _ = _train(Transformer(CFG, seed=3), loss_module.LabelSmoothedCrossEntropy(0.1, 0), _batches())
    with swapped_from_specs([f"all={solved}"], log=lambda line: None, grade=grade_swap, expand=solved_specs):
        model = Transformer(CFG, seed=3)
        crit = layer_class("LabelSmoothedCrossEntropy")(0.1, 0)
    losses, _ = _train(model, crit, _batches())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)


def test_train_py_swap_all_trains_like_numformer(solved, tmp_path, capsys):
    with kernel_mode("plain"):
        assert train.main(copy_args(tmp_path / "plain", 4)) == 0
        assert train.main(copy_args(tmp_path / "all", 4, "--swap", f"all={solved}")) == 0
    out = capsys.readouterr().out
    assert f"swap all={solved}: " in out and "swap: DecoderLayer <- " in out

    def losses(run):
        return [json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
                if "train_loss" in line]
    assert losses(tmp_path / "all") == losses(tmp_path / "plain") and len(losses(tmp_path / "plain")) == 4


@pytest.mark.parametrize("how, needle", [
    ("twice", "two files answer layernorm, "),
    ("wrong", "does not check exact (wrong"),
    ("unwritten", "does not check exact (not implemented)"),
    ("empty", "no exercise file in it"),
    ("absent", "no such folder"),
])
def test_swap_all_refuses_a_folder_it_cannot_trust_in_one_line(how, needle, solved, tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    if how == "wrong":
        _copy_of(solved, folder, wrong=("residual", exercises.get("residual").mistakes[0]))
    elif how == "unwritten":
        _copy_of(solved, folder, drop=("dropout",))
        from grad_checks.lab import write_exercise
        write_exercise("dropout", str(folder))
    elif how == "absent":
        folder.rmdir()
    elif how == "twice":  # right, both of them, but which one to train with is a guess: refused before grading
        _copy_of(solved, folder)
        (folder / "layernorm_v2.py").write_text((folder / "my_layernorm.py").read_text())
    out = tmp_path / "run"
    code, _, err = run_main(train.main, copy_args(out, 2, "--swap", f"all={folder}"), capsys)
    assert_one_line_error(code, err, "train.py", needle)
    if how in ("wrong", "unwritten"):
        assert ("my_residual.py" if how == "wrong" else "my_dropout.py") in err
    if how == "twice":
        assert f"{folder / 'my_layernorm.py'} and {folder / 'layernorm_v2.py'}: which one to train with is ambiguous" \
            in err
    assert not out.exists()  # refused before the run folder or the data were touched


def test_swap_all_says_which_files_it_did_not_use(solved, tmp_path):
    _copy_of(solved, tmp_path, drop=[n for n in exercises.ORDER if n != "relu"])
    (tmp_path / "notes.py").write_text("x = 1\n")
    specs, lines = solved_specs(str(tmp_path))
    assert specs == [f"ReLU={tmp_path / 'my_relu.py'}:ReLU"]
    assert lines[0].endswith(f"; not used: notes.py (python -m grad_checks exercise --status {tmp_path} says why)")


def test_a_file_graded_not_yours_is_not_exact_and_not_trained_with(solved, tmp_path, monkeypatch):
    """A grade that found numformer's own backward used (grad_checks/own_code.py; its ``not_yours`` line) is its
    own state in the table, and --swap all=DIR refuses it like any file that does not check exact."""
    import grad_checks.student_folder as student_folder
    _copy_of(solved, tmp_path, drop=[n for n in exercises.ORDER if n != "relu"])
    real = student_folder.check_file

    def numformers(*args, **kwargs):
        result, status, message = real(*args, **kwargs)
        result.not_yours = "calls numformer's own numformer.layers.relu.relu_backward (my_relu.py:70)"
        result.summary = lambda: f"NOT YOURS: {result.not_yours}"
        return result, status, message
    monkeypatch.setattr(student_folder, "check_file", numformers)
    row = student_folder.folder_status(tmp_path)[0]
    assert row.state == "not yours" and row.summary.startswith("NOT YOURS: calls numformer's own")
    with pytest.raises(SwapError, match=r"my_relu.py does not check exact \(not yours: NOT YOURS: calls"):
        student_folder.swap_specs(tmp_path)
