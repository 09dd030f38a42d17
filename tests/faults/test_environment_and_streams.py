"""Inputs that are not flags, through the one front (numformer/cli/front.py): the environment's numformer
variables and the standard streams. A variable whose value numformer cannot use is one line naming it, its
value and the values it takes (exit 2), when the command starts; importing numformer never fails for one.
A closed standard input or output is one line; a reader of standard output that has gone is a quiet exit
141 (as a tool killed by SIGPIPE); an encoding that cannot hold a character prints it as an escape. Never a
traceback or a bug report. A refused value that came from a resumed run's run.json names run.json."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import train
from support import ROOT, assert_one_line_error, run_main

TRANSLATE = str(ROOT / "translate.py")


def command(argv, env=None, stdin=b"", close=None, read_stdout=True):
    """Run a command line in a fresh process; ``close``: a descriptor closed in the child before it starts
    (``0`` for ``<&-``, ``1`` for ``>&-``); ``read_stdout`` False: the reader of its standard output is gone
    before it writes. -> (exit status, stdout, stderr) as text."""
    environ = {**os.environ, "NUMFORMER_DEBUG": "", **(env or {}),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=environ,
                            stdin=None if close == 0 else subprocess.PIPE,
                            stdout=None if close == 1 else subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: os.close(close)) if close is not None else None)
    if not read_stdout:
        proc.stdout.close()
    out, err = proc.communicate(None if close == 0 else stdin, timeout=120)
    text = lambda b: b.decode("utf-8", "replace") if b else ""  # noqa: E731
    return proc.returncode, text(out), text(err)


def assert_one_line(code, err, needle, status=2):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == status and len(lines) == 1 and needle in lines[0], (code, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err


BAD_VARIABLES = [("NUMFORMER_KERNELS", "turbo"), ("NUMFORMER_KERNELS_OFF", "attention,nope"),
                 ("NUMFORMER_NUM_THREADS", "abc"), ("NUMFORMER_NUM_THREADS", "0"), ("NUMFORMER_BLAS_TUNE", "maybe"),
                 ("NUMFORMER_MALLOC_TUNE", "2"), ("NUMFORMER_DEVICE", "gpu"), ("NUMFORMER_DEBUG", "yes?"),
                 ("NUMFORMER_CUDA_UNPROVEN", "maybe")]


@pytest.mark.parametrize("name, value", BAD_VARIABLES, ids=[f"{n}={v}" for n, v in BAD_VARIABLES])
def test_a_variable_numformer_cannot_use_is_one_line_naming_it(name, value, tmp_path):
    code, _, err = command([TRANSLATE, "--model", str(tmp_path / "no-model")], env={name: value})
    assert_one_line(code, err, f"the environment variable {name} holds {value!r}")
    assert f"unset {name}" in err


@pytest.mark.parametrize("name, value", [("NUMFORMER_KERNELS", "turbo"), ("NUMFORMER_KERNELS_OFF", "nope")])
def test_importing_numformer_never_fails_for_a_variable_its_first_use_does(name, value):
    """Import is fine (train.py's module-level tuning included); asking for the kernels is the NumformerError."""
    probe = ("import train, numformer.kernels as k\n"
             "from numformer.errors import NumformerError\n"
             "try:\n    k.kernel(len)\nexcept NumformerError as e:\n    print('refused:', e)\n")
    code, out, err = command(["-c", probe], env={name: value})
    assert code == 0 and f"refused: the environment variable {name} holds {value!r}" in out, (code, out, err[-2000:])


def test_closed_standard_output_is_one_line_before_any_work(fault_inputs):
    run, _, text = fault_inputs
    code, _, err = command([TRANSLATE, "--model", str(run), "--input", str(text), "--greedy"], close=1)
    assert_one_line(code, err, "standard output is closed")


def test_closed_standard_input_is_one_line_when_read(fault_inputs):
    run, _, _ = fault_inputs
    code, _, err = command([TRANSLATE, "--model", str(run), "--greedy"], close=0)
    assert_one_line(code, err, "standard input is closed")


@pytest.mark.parametrize("argv", ["translate", "export"])
def test_a_reader_gone_is_a_quiet_exit_141(argv, fault_inputs, tmp_path):
    """``translate.py ... | head -1``, ``python -m numformer.checkpoint ... | head -1``: no line, no bug report."""
    run, _, text = fault_inputs
    line = {"translate": [TRANSLATE, "--model", str(run), "--input", str(text), "--greedy"],
            "export": ["-m", "numformer.checkpoint", "export", str(run), "--out", str(tmp_path / "m.npz")]}[argv]
    code, _, err = command(line, read_stdout=False)
    assert (code, err) == (141, "")


def test_a_path_the_encoding_cannot_hold_is_printed_with_escapes(fault_inputs, tmp_path):
    """PYTHONIOENCODING=ascii and a path with an accent: the command's line on standard output escapes it."""
    run, _, _ = fault_inputs
    model = tmp_path / "modèle.npz"
    code, out, err = command(["-m", "numformer.checkpoint", "export", str(run), "--out", str(model)],
                             env={"PYTHONIOENCODING": "ascii"})
    assert code == 0 and "mod\\xe8le.npz" in out and model.is_file(), (code, out, err[-2000:])


@pytest.mark.parametrize("value, needle", [(0, "train_config.max_tokens must be an integer from 1 to 2147483647, got 0"),
                                           ("abc", "train_config.max_tokens is 'abc', not a number")])
def test_a_value_from_run_json_is_named_as_coming_from_it(value, needle, copy_run, tmp_path, capsys):
    """A --resume refused for a value the run's run.json holds names run.json, not a --max-tokens never typed."""
    run = shutil.copytree(copy_run, tmp_path / "run")
    settings = json.loads((run / "run.json").read_text())
    settings["train_config"]["max_tokens"] = value
    (run / "run.json").write_text(json.dumps(settings))
    code, _, err = run_main(train.main, ["--out", str(run), "--resume", "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", f"{run / 'run.json'}'s {needle}")


@pytest.mark.parametrize("field, value, needle", [
    ("dropout", 1.5, "model_config.dropout must be in [0, 1), got 1.5"),
    ("label_smoothing", "high", "model_config.label_smoothing is 'high', not a number"),
    ("pre_norm", "yes", "model_config.pre_norm is 'yes', not true or false"),
    ("init", ["xavier"], "model_config.init is ['xavier'], not a string"),
    ("dropout", 0.3, "model_config.dropout is 0.3 (trained: 0.1)"),  # valid, but not the checkpoint's
])
def test_a_model_setting_from_run_json_is_named_as_coming_from_it(field, value, needle, copy_run, tmp_path, capsys):
    """The model settings a --resume takes from run.json (dropout, label smoothing, ...) are refused naming
    ``RUN/run.json's model_config.FIELD``, a value of the wrong type included, never a flag the user did not type."""
    run = shutil.copytree(copy_run, tmp_path / "run")
    settings = json.loads((run / "run.json").read_text())
    settings["model_config"][field] = value
    (run / "run.json").write_text(json.dumps(settings))
    code, _, err = run_main(train.main, ["--out", str(run), "--resume", "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", f"{run / 'run.json'}'s {needle}")
    assert "--preset and model flags" not in err


@pytest.mark.parametrize("field, value, needle", [
    ("d_model", "wide", "model_config.d_model is 'wide', not an integer"),
    ("colour", "blue", "model_config has unknown fields 'colour'"),
    ("d_model", 96, "model_config does not fit"),  # valid, but not the architecture of the model it fine-tunes
])
def test_a_fine_tuning_runs_architecture_from_run_json_is_named_as_coming_from_it(field, value, needle, copy_run,
                                                                                    tmp_path, capsys):
    """A resumed --init-from run builds its model from run.json's model_config alone: a field of the wrong type,
    an unknown one, or an architecture the model it fine-tunes does not have is one line naming that file."""
    run = tmp_path / "tuned"
    model = copy_run / "checkpoints" / "step_0000006.npz"
    assert run_main(train.main, ["--task", "copy", "--preset", "tiny", "--init-from", str(model), "--max-steps", "1",
                                 "--out", str(run), "--no-progress", "--no-test", "--eval-every", "0",
                                 "--average-last", "1", "--max-tokens", "400"], capsys)[0] == 0
    settings = json.loads((run / "run.json").read_text())
    settings["model_config"][field] = value
    (run / "run.json").write_text(json.dumps(settings))
    code, _, err = run_main(train.main, ["--out", str(run), "--resume", "--max-steps", "2", "--no-progress"], capsys)
    assert_one_line_error(code, err, "train.py", f"{run / 'run.json'}'s {needle}")
