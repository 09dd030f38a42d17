"""bench/budget_race.py: numformer for T minutes, then PyTorch for 2T, each a run folder of its own, one table; an
earlier race is never overwritten, and flags that would make the sides differ are refused in one line."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RACE = [sys.executable, str(ROOT / "bench" / "budget_race.py")]


def test_a_tiny_race_reports_both_sides_and_refuses_to_run_again_into_its_folder(tmp_path):
    out = tmp_path / "race"
    cmd = [*RACE, "--task", "reverse", "--preset", "tiny", "--minutes", "0.03", "--out", str(out),
           "--", "--no-progress", "--eval-every", "0", "--log-every", "1", "--max-tokens", "500"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "race.json").read_text())
    assert [s["side"] for s in report["sides"]] == ["numformer-0.03min", "pytorch-0.06min"]
    for side in report["sides"]:
        assert side["steps"] >= 1 and side["budget_minutes"] in (0.03, 0.06)
        assert (out / side["side"] / "test_scores.json").exists()
        assert {"bleu", "chrf", "brevity_penalty", "length_ratio", "alpha"} <= set(side)
    assert report["machine"]["commit"] and report["machine"]["torch"].startswith("2.")
    assert "| numformer-0.03min | 0.03 min |" in (out / "race.md").read_text()
    before = (out / "race.json").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert "give a new --out" in again.stderr and (out / "race.json").read_text() == before


def test_a_budget_or_data_flag_after_the_separator_is_refused_in_one_line(tmp_path):
    for extra, words in ((["--max-steps", "3"], "sets each side's budget"), (["--preset", "tiny"], "set it before --")):
        res = subprocess.run([*RACE, "--task", "reverse", "--out", str(tmp_path / "r"), "--", *extra],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr
        assert not (tmp_path / "r").exists()
