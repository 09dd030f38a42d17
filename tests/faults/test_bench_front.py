"""The benches' front (issue 59 item 1): a count that cannot work, an input with nothing to time and a failed
worker each end in one line, never a traceback or a bug report of the bench's own.

* a zero where a bench needs at least one (``--steps``, ``--calls``, ``--batches`` ...) is refused as the flags
  are parsed: one line naming the flag, exit 2, before anything is timed;
* an input file with no line to decode is refused where the bench reads it: one line, exit 2;
* a worker (the child process a bench times a side in) that fails: the parent's one line is
  ``prog: error: the <which> worker failed: <the worker's own last line>``, with the worker's exit status;
  a worker's bug line (naming its traceback file) is passed on the same way, exit 1.

Every case fails before any timing starts; the benches run in-process through their ``main(argv)``, their
workers as the real child processes they are.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from numformer import environment
from numformer.errors import NumformerError
from support import ROOT, assert_one_line_error, load_file_module, run_main

BENCH = ROOT / "bench"
THREAD_VARS = load_file_module(BENCH / "thread_env.py", "bench_front_thread_env").THREAD_VARS
# a value of NUMFORMER_KERNELS numformer refuses: set for a worker only, it fails at once with its own line
REFUSED_KERNELS = "turbo"
REFUSED_LINE = "error: the environment variable NUMFORMER_KERNELS holds 'turbo'"


@pytest.fixture
def bench(monkeypatch):
    """Loads a bench script by its name as a module (bench/ on the path, as when it is run). A bench's main pins
    the thread counts of the environment for its workers (bench/thread_env.py): they are put back after the
    test, or every later subprocess of this pytest worker would run on other thread counts than the worker."""
    monkeypatch.syspath_prepend(str(BENCH))
    for var in THREAD_VARS:  # setenv records the value to put back (none: the variable is removed again)
        monkeypatch.setenv(var, os.environ.get(var, ""))
        if not os.environ[var]:
            monkeypatch.delenv(var)

    def load(name: str):
        return load_file_module(BENCH / f"{name}.py", f"bench_front_{name}")
    return load


@pytest.fixture
def refused_in_workers_only(monkeypatch):
    """NUMFORMER_KERNELS set to a value numformer refuses, for the workers: this process (the bench's parent)
    skips the front's check of the environment, so only the children, which check it as they start, refuse."""
    monkeypatch.setattr(environment, "check_all", lambda: None, raising=False)  # (a front without the check: none)
    monkeypatch.setenv("NUMFORMER_KERNELS", REFUSED_KERNELS)


@pytest.fixture
def one_line_file(tmp_path) -> Path:
    path = tmp_path / "one.src"
    path.write_text("a b c\n", encoding="utf-8")
    return path


@pytest.fixture
def empty_file(tmp_path) -> Path:
    path = tmp_path / "empty.src"
    path.write_text("\n  \n", encoding="utf-8")  # blank lines only: nothing to decode
    return path


# -- counts that cannot work ------------------------------------------------------------------------------

ZERO_COUNTS = [  # (bench, its arguments, the flag its line names); "{run}"/"{input}"/"{out}": filled below
    ("train_step", ["--preset", "tiny", "--no-torch", "--steps", "0"], "--steps"),
    ("per_sentence_cost", ["--preset", "tiny", "--steps", "0"], "--steps"),
    ("step_breakdown", ["--device", "cpu", "--quick", "--steps", "0"], "--steps"),
    ("kernel_speed", ["--calls", "0"], "--calls"),
    ("data_scale", ["--pairs", "1", "--vocab-size", "0"], "--vocab-size"),
    ("data_parallel", ["--task", "copy", "--configs", "0x1"], "--configs"),
    ("decode", ["--model", "{run}", "--input", "{input}", "--no-torch", "--no-ctranslate2", "--beam", "0"], "--beam"),
    ("transformers_agreement", ["--model", "{run}", "--input", "{input}", "--batch", "0"], "--batch"),
    ("gpu_train_step", ["--device", "cuda", "--precision", "fp32", "--no-torch", "--steps", "0"], "--steps"),
    ("wmt_shaped_corpus", ["--out", "{out}", "--pairs", "0"], "--pairs"),
]


@pytest.mark.parametrize("name,argv,flag", ZERO_COUNTS, ids=[f"{n}{a[-2]}" for n, a, _ in ZERO_COUNTS])
def test_a_count_that_cannot_work_is_one_line(name, argv, flag, bench, capsys, random_run, one_line_file, tmp_path):
    argv = [a.format(run=random_run, input=one_line_file, out=tmp_path / "corpus") for a in argv]
    code, _, err = run_main(bench(name).main, argv, capsys)
    assert_one_line_error(code, err, f"bench/{name}.py", flag)
    assert not (tmp_path / "corpus").exists()  # refused before anything was written


# -- an input with nothing to time ------------------------------------------------------------------------

EMPTY_INPUTS = [
    ("decode", ["--model", "{run}", "--input", "{empty}", "--no-torch", "--no-ctranslate2"]),
    ("short_hypotheses", ["--run", "{run}", "--source", "{empty}", "--reference", "{empty}"]),
    ("transformers_agreement", ["--model", "{run}", "--input", "{empty}"]),
]


@pytest.mark.parametrize("name,argv", EMPTY_INPUTS, ids=[n for n, _ in EMPTY_INPUTS])
def test_an_input_with_nothing_to_decode_is_one_line(name, argv, bench, capsys, random_run, empty_file):
    argv = [a.format(run=random_run, empty=empty_file) for a in argv]
    code, _, err = run_main(bench(name).main, argv, capsys)
    assert_one_line_error(code, err, f"bench/{name}.py", "no non-empty line")
    assert str(empty_file) in err


# -- a worker's failure passed on -------------------------------------------------------------------------

WORKER_REFUSALS = [  # (bench, its arguments, the worker that runs first)
    ("train_step", ["--preset", "tiny", "--no-torch", "--steps", "1", "--warmup", "0"], "peak worker"),
    ("per_sentence_cost", ["--preset", "tiny", "--steps", "1", "--warmup", "0"], "off worker"),
    ("data_scale", ["--pairs", "1", "--vocab-size", "100", "--json"], "prepare worker"),
]


@pytest.mark.parametrize("name,argv,worker", WORKER_REFUSALS, ids=[n for n, _, _ in WORKER_REFUSALS])
def test_a_worker_that_refuses_is_passed_on_in_its_own_line(name, argv, worker, bench, capsys,
                                                            refused_in_workers_only):
    code, _, err = run_main(bench(name).main, argv, capsys)
    assert_one_line_error(code, err, f"bench/{name}.py", f"the {worker} failed: ")
    assert REFUSED_LINE in err  # the worker's own line, whole
    assert err.count("error:") == 2  # the parent's and the worker's, on one line


def test_a_worker_that_cannot_load_its_model_is_passed_on(bench, capsys, tmp_path):
    """decode_profile.py's workers load the model (the parent never does): their refusal is the parent's line."""
    missing = tmp_path / "no-such-run"
    code, _, err = run_main(bench("decode_profile").main, ["--model", str(missing), "--calls", "1", "--repeat", "1"],
                            capsys)
    assert_one_line_error(code, err, "bench/decode_profile.py", "the numformer worker failed: bench/decode_profile.py: "
                                                               "error: ")
    assert str(missing) in err


def test_decode_passes_a_failed_side_on_as_a_users_error(bench, tmp_path):
    """bench/decode.py's run_side: a side's worker that refuses raises the worker's line, its exit status, not a
    RuntimeError of the parent's (which the front reported as a bug of the bench's with a crash log of its own)."""
    missing = tmp_path / "no-such-run"
    with pytest.raises(NumformerError) as failed:
        bench("decode").run_side(["--model", str(missing), "--no-torch", "--no-ctranslate2"], "numformer", 4)
    line = str(failed.value)
    assert line.startswith("the numformer worker failed: bench/decode.py: error: ") and str(missing) in line
    assert "\n" not in line and failed.value.exit_code == 2


def test_a_workers_bug_line_is_passed_on_with_its_traceback_file(bench, capsys, tmp_path, monkeypatch):
    """A bug in a worker (planted at its start by a sitecustomize on the workers' path) is the worker's own bug
    line, naming the file its traceback went to, passed on by the parent, exit 1."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(
        "import numformer.environment\n"
        "def planted():\n"
        "    raise RuntimeError('planted worker bug')\n"
        "numformer.environment.check_all = planted\n", encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(plant))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the worker writes its traceback
    code, _, err = run_main(bench("decode_profile").main, ["--calls", "1", "--repeat", "1"], capsys)
    assert_one_line_error(code, err, "bench/decode_profile.py",
                          "the numformer worker failed: bench/decode_profile.py: internal error (a bug in numformer",
                          status=1)
    found = re.search(r"the traceback is in (\S+):", err)
    assert found, err
    traceback_file = Path(found.group(1))
    assert traceback_file.parent == tmp_path and "planted worker bug" in traceback_file.read_text(encoding="utf-8")
