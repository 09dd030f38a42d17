"""bench/budget_race.py: numformer for T minutes, then PyTorch for 2T, each a run folder of its own, one table; a race
run again reads its finished sides; other settings, a half-done side and flags that would make the sides differ are
refused in one line."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RACE = [sys.executable, str(ROOT / "bench" / "budget_race.py")]


def test_a_tiny_race_reports_both_sides_reads_them_again_and_refuses_what_would_mix_or_overwrite_runs(tmp_path):
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
    scores = (out / "numformer-0.03min" / "test_scores.json").read_text()
    again = subprocess.run([*cmd[:cmd.index("--")], "--equal", *cmd[cmd.index("--"):]], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr  # done sides read, not trained again; --equal adds PyTorch at T
    assert again.stdout.count("done before, read from its folder") == 2
    assert (out / "numformer-0.03min" / "test_scores.json").read_text() == scores
    assert len(json.loads((out / "race.json").read_text())["sides"]) == 3
    other = subprocess.run([*cmd[:cmd.index("0.03")], "0.05", *cmd[cmd.index("0.03") + 1:]], capture_output=True,
                           text=True, timeout=300)
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1
    assert "other settings" in other.stderr
    (out / "pytorch-0.06min" / "test_scores.json").unlink()  # as a side stopped part way leaves its folder
    half = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert half.returncode == 2 and len(half.stderr.strip().splitlines()) == 1 and "half-done" in half.stderr


def test_a_budget_or_data_flag_after_the_separator_is_refused_in_one_line(tmp_path):
    for extra, words in ((["--max-steps", "3"], "sets each side's budget"), (["--preset", "tiny"], "set it before --")):
        res = subprocess.run([*RACE, "--task", "reverse", "--out", str(tmp_path / "r"), "--", *extra],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and words in res.stderr, res.stderr
        assert not (tmp_path / "r").exists()
