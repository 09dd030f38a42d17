"""bench/train_step.py on real batches (``--data``): both sides time the same batches, each exactly once."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from numformer.data import make_synthetic, write_parallel_dir
from support import ROOT, load_file_module

SCRIPT = ROOT / "bench" / "train_step.py"


def test_each_real_batch_is_timed_once_after_the_warmup():
    order = load_file_module(SCRIPT, "train_step_bench").timed_steps(SimpleNamespace(batches_file="batches.npz", warmup=2, steps=99), [None] * 5)
    assert [j for j, counts in order if not counts] == [0, 1] and not any(c for _, c in order[:2])
    assert sorted(j for j, counts in order if counts) == [0, 1, 2, 3, 4]


def test_real_batches_are_timed_on_both_sides(tmp_path):
    pytest.importorskip("torch")
    data = write_parallel_dir(tmp_path / "corpus", make_synthetic("reverse", 300, 20, 20, seed=0))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--data", str(data), "--batches", "3",
                           "--warmup", "1", "--max-tokens", "400", "--threads", "1", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    real = res["real_batches"]
    assert real["batches"] == 3 and real["max_tokens"] == 400 and "torch_compiled" not in res
    for side in (res, res["torch"], res["torch_best"]):
        # target tokens/s is the batches' real target tokens over the time of the 3 steps: each counted once
        assert side["tokens_per_s"] * side["mean_step_ms"] * 3 / 1e3 == pytest.approx(real["tgt_tokens"], rel=1e-9)
    assert res["ratio_step_time"] == pytest.approx(res["mean_step_ms"] / res["torch"]["mean_step_ms"])
