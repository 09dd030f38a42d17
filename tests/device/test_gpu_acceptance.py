"""The GPU acceptance command's dry run (``--device cpu --quick``): every part runs, the output is as documented.

``bench/gpu_acceptance.py`` is meant for the first minutes of a lent GPU; this runs the
same script on the CPU with tiny shapes, so it cannot rot before a GPU appears. The
output format checked here is the one ``docs/gpu.md`` ("The acceptance run") describes.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_acceptance.py"
RUN_SCRIPT = ROOT / "bench" / "gpu_run.sh"  # the one command run on the GPU machine
GPU_MACHINE = Path(__file__).resolve().parent / "gpu_machine"
PARTS = ["env", "proofs", "train_step", "breakdown", "launches", "gpu_tests", "grad_checks", "torch_parity", "kernels",
         "train", "decode"]  # the order that matters: the proofs alone first, then the step's figures, then the rest
STATUSES = {"ok", "failed", "timeout", "skipped", "missing", "no tests", "out of time"}


def only_gpu_machine_packages() -> dict:
    """An environment in which Python sees only the GPU machine's packages (tests/device/gpu_machine/)."""
    return {**os.environ, "PYTHONPATH": str(GPU_MACHINE)}


def _files(out: Path):
    return [p for p in out.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_quick_cpu_dry_run_writes_the_documented_summary(tmp_path):
    """The dry run's parts all finish ok and the summary has the documented form, run as on the GPU machine:
    through bench/gpu_run.sh, with only the packages that machine has (numformer not installed). Its time boxes and budget
    exist for a GPU lease; here they are ten times as long, so that a slow or busy machine is not a failure
    (the budget's own behaviour is the next test's)."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(RUN_SCRIPT), str(out), "--device", "cpu", "--quick", "--box-scale", "10",
                           "--budget-s", "3000", "--work", str(tmp_path / "work")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=3600, env=only_gpu_machine_packages())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = _files(out)
    assert len(files) <= 8 and all(len(f.relative_to(out).parts) <= 3 for f in files)
    assert {f.name for f in files} >= {"summary.json", "log.txt", "train_metrics.jsonl", "console.txt"}
    assert (out / "console.txt").read_text() == proc.stdout  # teed as it came
    s = json.loads((out / "summary.json").read_text())
    assert s["format"] == "numformer-gpu-acceptance/1" and s["device"] == "cpu" and s["quick"] is True and s["ok"]
    assert list(s["parts"]) == PARTS
    for name, part in s["parts"].items():
        assert part["status"] in STATUSES and isinstance(part["seconds"], float), name
    p = s["parts"]
    assert p["env"]["status"] == "ok" and p["env"]["numpy"]
    assert p["gpu_tests"]["status"] == "skipped" and p["gpu_tests"]["counts"]["skipped"] > 0  # no GPU here
    proofs = p["proofs"]["kernels"]  # one child per kernel, each recorded with its source's hash as it ends
    assert list(proofs) == ["adam", "layernorm", "linear", "loss", "dropout", "attention", "gemm handle", "step graphs"]
    assert all(v["status"] == "skipped" and v["counts"]["skipped"] > 0 for v in proofs.values()), proofs
    assert all(proofs[k]["sha256"] == s["cuda_sources"][k] for k in s["cuda_sources"])
    assert s["cuda_proofs"] == {}  # nothing proven without a GPU
    assert p["launches"]["status"] == "skipped"  # the GPU machine's cupy is not installed here (test_standin_capture)
    assert p["grad_checks"]["status"] == "ok" and p["grad_checks"]["checks"] > 100 and p["grad_checks"]["failed"] == 0
    assert p["grad_checks"]["dtype"] == "float64"
    assert p["torch_parity"]["status"] == "skipped"
    assert p["kernels"]["status"] in ({"ok"} if (ROOT / "tests" / "kernels" / "test_kernels.py").exists() else {"missing"})
    train = p["train"]
    assert train["status"] == "ok" and train["steps"] == 6 and train["learned"]
    assert [step for step, _ in train["valid_loss_curve"]] == [2, 4, 6]
    rows = p["train_step"]["rows"]
    assert [r["precision"] for r in rows] == ["fp32", "fp16"]
    for r in rows:
        nf = r["numformer"]
        assert nf["status"] == "ok" and nf["median_step_ms"] > 0 and nf["target_tokens_per_s"] > 0
        assert nf["peak_memory_mb"] > 0 and r["torch"]["status"] == "ok" and r["ratio_step_time"] > 0
        assert r["numformer_graphs"]["status"] == "ok" and r["numformer_graphs"]["median_step_ms"] > 0
    breakdown = p["breakdown"]
    assert breakdown["status"] == "ok" and breakdown["plain_step_ms"] > 0
    assert {"Adam", "gradient norm and read-back"} <= {r["layer"] for r in breakdown["rows"]}
    dec = p["decode"]
    assert [(r["model"].split()[0], r["search"]) for r in dec["rows"]] == [
        ("small", "beam 4"), ("small", "greedy"), ("trained", "beam 4"), ("trained", "greedy")]
    assert all(r["sentences_per_s"] > 0 for r in dec["rows"]) and "bleu" in dec["rows"][2]
    assert dec["torch"]["status"] == "not implemented"
    assert "acceptance on cpu (quick): OK" in proc.stdout


def test_parts_past_the_budget_are_recorded_not_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick", "--budget-s", "1",
                           "--parts", "env,grad_checks,train_step", "--work", str(tmp_path / "work")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    s = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 1 and s["ok"] is False
    assert {k: v["status"] for k, v in s["parts"].items()} == {
        "env": "out of time", "grad_checks": "out of time", "train_step": "out of time"}


def test_unknown_part_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--parts", "env,nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown part(s) nope" in proc.stderr


def test_the_gpu_machine_emulation_refuses_what_is_not_there(tmp_path):
    """The package emulation the dry run runs under can fail: ctranslate2 (installed here, not there) is refused,
    numformer is not installed, and what the acceptance needs is there."""
    code = ("import importlib.util as u\n"
            "try:\n    import ctranslate2\nexcept ModuleNotFoundError:\n    print('refused')\n"
            "print(u.find_spec('numformer') is None, all(u.find_spec(m) for m in "
            "('numpy', 'torch', 'sentencepiece', 'sacrebleu', 'tqdm', 'pytest')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=only_gpu_machine_packages())
    assert proc.stdout.split() == ["refused", "True", "True"], proc.stdout + proc.stderr


def test_the_run_script_refuses_a_real_run_without_the_carried_corpus(tmp_path):
    env = {**os.environ, "NUMFORMER_GPU_CARRY": str(tmp_path / "not-prepared")}
    proc = subprocess.run(["bash", str(RUN_SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 2 and "run 'bash bench/gpu_prepare.sh'" in proc.stderr
