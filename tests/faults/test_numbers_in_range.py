"""Every number a command takes has a range (issue 68), checked at the front in one line naming the flag and the
range: numformer/cli/arguments.py's table of numbers (``NUMBERS``), whose rows are the flags' ``type=`` and check
the same settings where a resumed run reads them back from run.json. At 4439216 ``--seed 99999999999`` was a
traceback from inside sentencepiece, ``grad_checks --seed -1`` and ``--step 0`` tracebacks, ``translate.py
--max-len-a 1e19`` an integer overflow that cut every output to one token (exit 0), ``--lr-factor 1e300`` eight
lines of numpy warnings before the exit-3 line, ``--max-tokens 1`` batches of eight tokens and nothing said, and
``check FILE --seed -1`` blamed the student's right file for the flag."""
import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

import lab_files
import train
import translate
from grad_checks import exercises
from grad_checks.__main__ import main as grad_checks_main
from numformer.prepare import main as prepare_main
from numformer.studies.__main__ import main as studies_main
from support import ROOT, assert_one_line_error, copy_args, run_main


def command_files():
    """Every file that builds a command line: train.py, translate.py and the modules of numformer, grad_checks
    and bench that call add_argument."""
    files = [ROOT / "train.py", ROOT / "translate.py"]
    for folder in ("numformer", "grad_checks", "bench"):
        files += [p for p in sorted((ROOT / folder).rglob("*.py")) if "add_argument(" in p.read_text("utf-8")]
    return files


def unranged_numbers(path):
    """``FILE:LINE --flag`` of every add_argument whose value is a number without a range: ``type=int`` or
    ``type=float``, or a numeric default with no type at all (argparse would hand over a string)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        flag = next((a.value for a in node.args if isinstance(a, ast.Constant)), "?")
        kind = keywords.get("type")
        default = keywords.get("default")
        plain = isinstance(kind, ast.Name) and kind.id in ("int", "float")
        untyped = (kind is None and "action" not in keywords and isinstance(default, ast.Constant)
                   and isinstance(default.value, (int, float)) and not isinstance(default.value, bool))
        if plain or untyped:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {flag}")
    return found


def test_every_number_flag_of_every_command_has_a_range():
    files = command_files()
    assert len(files) > 20  # the walk finds the commands (train.py, translate.py, grad_checks, the benches...)
    offenders = [hit for path in files for hit in unranged_numbers(path)]
    assert offenders == [], f"numbers without a range (give them a row of numformer.cli.arguments.NUMBERS): {offenders}"


@pytest.fixture(scope="module")
def right_file(tmp_path_factory):
    """numformer's own LayerNorm backward written as a student's file: it grades EXACT."""
    ex = exercises.get("layernorm")
    return lab_files.write(ex, ex.target, tmp_path_factory.mktemp("lab"))


def flag_cases(run, right_file, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("a b c\n", encoding="utf-8")
    tiny = ["--task", "copy", "--preset", "tiny", "--max-steps", "1", "--no-test", "--eval-every", "0", "--no-progress",
            "--out", str(tmp_path / "t")]  # were the number taken, a run of one step
    return {
        "train --seed (sentencepiece's uint32)": (train.main, "train.py", [*tiny, "--seed", "99999999999"],
                                                  "argument --seed: must be an integer from 0 to 4294967295"),
        "train --lr-factor": (train.main, "train.py", [*tiny, "--lr-factor", "1e300"],
                              "argument --lr-factor: must be in (0, 1000]"),
        "train --max-tokens": (train.main, "train.py", [*tiny, "--max-tokens", "99999999999"],
                               "argument --max-tokens: must be an integer from 1 to 2147483647"),
        "train --max-minutes": (train.main, "train.py", [*tiny, "--max-minutes", "1e300"],
                                    "argument --max-minutes: must be in (0, 1e+06]"),
        "translate --max-len-a": (translate.main, "translate.py", ["--model", str(run), "--input", str(text), "--max-len-a", "1e19"],
                                  "argument --max-len-a: must be in [0, 1024]"),
        "translate --beam": (translate.main, "translate.py", ["--model", str(run), "--input", str(text), "--beam", "1025"],
                             "argument --beam: must be an integer from 1 to 1024"),
        "grad_checks --seed": (grad_checks_main, "python -m grad_checks", ["--seed", "-1"],
                               "argument --seed: must be an integer from 0 to 4294967295"),
        "grad_checks --step": (grad_checks_main, "python -m grad_checks", ["--step", "0"],
                               "argument --step: must be in (0, 0.1]"),
        "grad_checks --tolerance": (grad_checks_main, "python -m grad_checks", ["--tolerance", "nan"],
                                    "argument --tolerance: must be in (0, 1]"),
        "check FILE --seed": (grad_checks_main, "python -m grad_checks check", ["check", str(right_file), "--seed", "-1"],
                              "argument --seed: must be an integer from 0 to 4294967295"),
        "hint --step": (grad_checks_main, "python -m grad_checks hint", ["hint", str(right_file), "--step", "0"],
                        "argument --step: must be an integer from 1 to 2147483647"),
        "prepare --seed": (prepare_main, "python -m numformer.prepare",
                           ["--task", "copy", "--out", str(tmp_path / "p"), "--seed", "4294967296"],
                           "argument --seed: must be an integer from 0 to 4294967295"),
        "table3 --seeds": (studies_main, "python -m numformer.studies",
                           ["table3", "--small", "--out", str(tmp_path / "s"), "--seeds", "1,99999999999"],
                           "--seeds takes distinct seeds, each an integer from 0 to 4294967295"),
        "table3 --steps": (studies_main, "python -m numformer.studies",
                           ["table3", "--small", "--out", str(tmp_path / "s"), "--steps", "0"],
                           "argument --steps: must be an integer from 1 to 2147483647"),
    }


CASES = ["train --seed (sentencepiece's uint32)", "train --lr-factor", "train --max-tokens", "train --max-minutes",
         "translate --max-len-a", "translate --beam", "grad_checks --seed", "grad_checks --step",
         "grad_checks --tolerance", "check FILE --seed", "hint --step", "prepare --seed", "table3 --seeds",
         "table3 --steps"]


@pytest.mark.parametrize("case", CASES)
def test_a_number_out_of_its_range_is_one_line_naming_the_flag_and_the_range(case, copy_run, right_file, tmp_path,
                                                                            capsys):
    main, prog, argv, needle = flag_cases(copy_run, right_file, tmp_path)[case]
    code, out, err = run_main(main, argv, capsys)
    assert_one_line_error(code, err, prog, needle)
    assert out == "" and not any((tmp_path / name).exists() for name in ("p", "s", "t"))


@pytest.mark.parametrize("field, value, needle", [
    ("seed", 99999999999, "train_config.seed must be an integer from 0 to 4294967295, got 99999999999"),
    ("lr_factor", 1e300, "train_config.lr_factor must be in (0, 1000], got 1e+300"),
])
def test_a_number_out_of_range_in_run_json_is_named_as_coming_from_it(field, value, needle, copy_run, tmp_path,
                                                                     capsys):
    run = shutil.copytree(copy_run, tmp_path / "run")
    settings = json.loads((run / "run.json").read_text())
    settings["train_config"][field] = value
    (run / "run.json").write_text(json.dumps(settings))
    code, _, err = run_main(train.main, ["--out", str(run), "--resume", "--max-steps", "7", "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", f"{run / 'run.json'}'s {needle}")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000003.npz", "step_0000006.npz"]


def test_a_token_budget_no_pair_fits_is_one_line_before_the_run_folder_is_made(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_main(train.main, [*copy_args(out, 2)[:-4], "--max-tokens", "1"], capsys)
    assert_one_line_error(code, err, "train.py", "--max-tokens 1 holds no training pair: the smallest takes")
    assert not out.exists()


def test_pairs_larger_than_the_token_budget_are_counted_in_the_epochs_line(tmp_path, capsys):
    code, out, err = run_main(train.main, [*copy_args(tmp_path / "run", 1)[:-4], "--max-tokens", "12"], capsys)
    assert code == 0, err
    epoch = next(line for line in out.splitlines() if line.startswith("epoch 0:"))
    assert "larger than --max-tokens 12" in epoch and "each a batch of its own" in epoch, epoch


# Train the copy task with every weight multiplied by 1e30 after step 2: every later step overflows (float32
# matmuls of 1e30-sized weights), each is skipped, and the third in a row stops training (exit 3).
OVERFLOW_HARNESS = r"""
import runpy, sys
root = sys.argv[1]
sys.argv = sys.argv[2:]
sys.path.insert(0, root)
from numformer.training import trainer
real_step = trainer.Trainer.train_step
def train_step(self, *args, **kwargs):
    result = real_step(self, *args, **kwargs)
    if self.optimizer.step_count == 2:
        for p in self.model.parameters():
            p.data *= 1e30
    return result
trainer.Trainer.train_step = train_step
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_an_overflow_in_training_is_the_exit_3_line_alone(tmp_path):
    """No ``RuntimeWarning: overflow encountered in matmul`` before training's own line."""
    env = {**os.environ, "NUMFORMER_DEBUG": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", OVERFLOW_HARNESS, str(ROOT), str(ROOT / "train.py"),
                           *copy_args(tmp_path / "run", 20, "--stop-after-nonfinite", "3")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert len(lines) == 1 and "3 steps in a row had a non-finite loss or gradient" in lines[0], proc.stderr[-2000:]
