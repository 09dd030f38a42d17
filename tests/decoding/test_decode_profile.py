"""bench/decode_profile.py (docs/speed.md's decoding profile) runs end to end on a small random model and reports
every piece of a beam step, for both sides, with the per-step column the layer count times the per-layer time."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_decode_profile_reports_every_piece_for_both_sides():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_profile.py"), "--preset", "tiny", "--sentences", "3",
                          "--cached", "4", "--source", "5", "--calls", "1", "--repeat", "1", "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    report = json.loads(out)
    pieces = {p["piece"]: p for p in report["pieces"]}
    assert report["rows"] == 12 and report["repeat"] == 1
    assert {"output projection", "whole decoder step", "cache reorder (each beam takes its parent's keys/values)",
            "self-attention over 4 cached positions", "log-softmax and best 8 per sentence"} <= set(pieces)
    for p in pieces.values():
        assert p["numformer_ms"] > 0 and p["torch_ms"] > 0
        factor = report["layers"] if p["per"] == "layer" else 1
        assert abs(p["numformer_ms_per_step"] - p["numformer_ms"] * factor) < 1e-2


def test_decode_profile_refuses_a_zero_count_in_one_line():
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_profile.py"), "--calls", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "--calls: must be an integer from 1" in res.stderr  # the argparse type positive_int
