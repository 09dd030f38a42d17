"""bench/recipe_sweep.py: one train.py run per grid point, scored on validation only; a finished point is read, not
trained again; a half-done point and a malformed grid are refused in one line."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

from numformer.decoding.valid_choice import ALPHAS

ROOT = Path(__file__).resolve().parents[2]
SWEEP = [sys.executable, str(ROOT / "bench" / "recipe_sweep.py")]


def sweep(out, *extra):
    return subprocess.run([*SWEEP, "--task", "reverse", "--preset", "tiny", "--minutes", "0.03", "--grid",
                           "warmup=50,400", "--out", str(out), *extra], capture_output=True, text=True, timeout=900)


def test_a_two_point_sweep_scores_each_point_on_validation_and_continues_where_it_stopped(tmp_path):
    out = tmp_path / "sweep"
    res = sweep(out)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "sweep.json").read_text())
    assert [p["point"] for p in report["points"]] == ["warmup50", "warmup400"]
    for p in report["points"]:
        assert p["steps"] >= 1 and p["alpha"] in ALPHAS and p["valid_sentences"] == 500
        assert not (out / p["point"] / "test_scores.json").exists()  # the test split is never read
    first = (out / "warmup50" / "decoding.json").stat().st_mtime_ns
    steps = report["points"][0]["steps"]
    (out / "warmup50" / "metrics.jsonl").unlink(missing_ok=True)  # as a run shorter than one log interval leaves it
    shutil.rmtree(out / "warmup400")
    again = sweep(out)
    assert again.returncode == 0, again.stderr
    assert (out / "warmup50" / "decoding.json").stat().st_mtime_ns == first  # read, not trained again
    assert "point 1 of 2" in again.stdout and (out / "warmup400" / "decoding.json").exists()
    assert json.loads((out / "sweep.json").read_text())["points"][0]["steps"] == steps  # from its last checkpoint
    (out / "warmup400" / "decoding.json").unlink()  # as a run stopped before its choice leaves it
    half = sweep(out)
    assert half.returncode == 2 and len(half.stderr.strip().splitlines()) == 1 and "half-done" in half.stderr


def test_a_malformed_grid_is_refused_in_one_line(tmp_path):
    for grid, words in (("warmup", "expected NAME=V1,V2"), ("beam=2,4", "expected NAME=V1,V2"),
                        ("warmup=a,b", "warmup: expected an integer, got 'a'"),
                        ("warmup=0", "warmup: must be an integer from 1 to")):  # train.py's own range
        res = subprocess.run([*SWEEP, "--task", "reverse", "--minutes", "1", "--grid", grid, "--out", str(tmp_path / "s")],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr
