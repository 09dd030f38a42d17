"""bench/step_breakdown.py on the CPU with tiny shapes: every layer call is timed once, exclusively."""
import json
import subprocess
import sys

from numformer.data import make_synthetic, write_parallel_dir
from support import ROOT


def test_the_breakdown_times_each_layer_call_once_and_adds_up():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "step_breakdown.py"), "--device", "cpu", "--quick",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    rows = {(r["layer"], r["pass"]): r for r in res["rows"]}
    # one encoder and one decoder layer: q, k, v, o in each attention (3 attentions), two maps per feed-forward
    assert rows["Linear", "forward"]["calls_per_step"] == rows["Linear", "backward"]["calls_per_step"] == 4 * 3 + 2 * 2
    assert rows["LayerNorm", "forward"]["calls_per_step"] == 5  # 2 + 3 residual norms (post-LN)
    assert rows["Adam", "step"]["calls_per_step"] == rows["loss", "forward"]["calls_per_step"] == 1
    # exclusive times: the rows add up to what was timed, which is the tapped step less the untimed glue
    assert abs(sum(r["ms_per_step"] for r in res["rows"]) - res["timed_ms"]) < 0.05 * len(rows)
    assert abs(sum(r["share"] for r in res["rows"]) - 1) < 1e-3
    assert 0 < res["timed_ms"] <= res["tapped_step_ms"]


def test_real_batches_are_each_timed_once(tmp_path):
    data = write_parallel_dir(tmp_path / "corpus", make_synthetic("reverse", 300, 20, 20, seed=0))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "step_breakdown.py"), "--device", "cpu", "--shape",
                           "tiny", "--data", str(data), "--batches", "3", "--max-tokens", "400", "--warmup", "1",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["steps"] == 3 and res["shape"]["batches"] == 3
    assert res["target_tokens_per_step"] * 3 == res["shape"]["tgt_tokens"]
    rows = {(r["layer"], r["pass"]): r for r in res["rows"]}
    assert rows["Adam", "step"]["calls_per_step"] == 1  # one update per batch
