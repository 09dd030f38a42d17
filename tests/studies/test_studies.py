"""numformer.studies: each study's small configuration shows its paper's qualitative finding (the bounds of
its check() clear the measured figures with margin), and a planted change (both placements made the same)
makes that check fail. The CLI lists the studies and writes the picture, table and numbers of one."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from numformer.studies import STUDIES, get
from numformer.studies import ln_placement, output_change, warmup

ROOT = Path(__file__).resolve().parents[2]
SAME = {"post-LN": False, "pre-LN": False}  # the planted change: "pre-LN" builds a post-LN model too


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def ln_results():
    return ln_placement.measure(ln_placement.SMALL, log=_quiet)


def test_ln_placement_post_ln_rises_toward_the_output_only_with_xavier(ln_results):
    assert ln_placement.check(ln_results) == []
    rows = {(r["init"], r["stack"], r["placement"]): r for r in ln_placement.findings(ln_results)}
    post, pre = rows["xavier", "decoder", "post-LN"], rows["xavier", "decoder", "pre-LN"]
    assert post["last_over_first"] > ln_placement.POST_RISE_MIN
    assert ln_placement.PRE_FLAT[0] < pre["last_over_first"] < ln_placement.PRE_FLAT[1]
    assert post["post_over_pre_last"] > 1.5  # post-LN's last layer is larger than pre-LN's (Theorem 1: sqrt(L))
    assert rows["pytorch", "decoder", "post-LN"]["last_over_first"] < ln_placement.PYTORCH_POST_MAX
    # the branches start smaller under numformer's default init: the theorem's premise fails there
    assert rows["pytorch", "decoder", "post-LN"]["branch_ratio"] < 0.6 * post["branch_ratio"]


def test_ln_placement_check_fails_when_both_placements_are_post_ln(monkeypatch):
    monkeypatch.setattr(ln_placement, "PRE_NORM", SAME)
    planted = ln_placement.measure(replace(ln_placement.SMALL, inits=("xavier",)), log=_quiet)
    failed = ln_placement.check(planted)
    assert failed and all("pre-LN" in f for f in failed), failed


def test_output_change_post_ln_amplifies_updates_with_depth():
    results = output_change.measure(output_change.SMALL, log=_quiet)
    assert output_change.check(results) == []
    rows = {(r["update"], r["placement"]): r for r in output_change.findings(results)}
    assert rows["random", "post-LN"]["exponent"] > 1.0  # O(N) or faster; pre-LN's is lower (check())
    assert rows["adam", "post-LN"]["post_over_pre_deepest"] > output_change.POST_OVER_PRE_MIN


def test_output_change_check_fails_when_both_placements_are_post_ln(monkeypatch):
    monkeypatch.setattr(output_change, "PRE_NORM", SAME)
    failed = output_change.check(output_change.measure(output_change.SMALL, log=_quiet))
    assert any("pre-LN" in f for f in failed), failed


@pytest.fixture(scope="module")
def warmup_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("warmup")


def test_warmup_post_ln_fails_without_warmup_where_the_others_learn(warmup_runs):
    results = warmup.measure(warmup.SMALL, warmup_runs, log=_quiet)
    assert warmup.check(results) == []
    rows = {r["run"]: r for r in warmup.findings(results)}
    cfg = warmup.SMALL
    assert not rows[warmup.run_name("post-LN", False, cfg)]["learns"]
    assert all(rows[warmup.run_name(p, w, cfg)]["learns"] for p, w in (("post-LN", True), ("pre-LN", True),
                                                                        ("pre-LN", False)))


def test_warmup_check_fails_when_both_placements_are_post_ln(warmup_runs, monkeypatch):
    monkeypatch.setattr(warmup, "PRE_NORM", SAME)
    # the planted change leaves the post-LN runs as they were: only the "pre-LN" ones are run again
    failed = warmup.check(warmup.measure(replace(warmup.SMALL, placements=("pre-LN",)), warmup_runs, log=_quiet))
    assert any("pre-LN-nowarmup" in f for f in failed), failed


def test_cli_lists_the_studies_and_refuses_an_unknown_one():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run([sys.executable, "-m", "numformer.studies", "--list"], capture_output=True, text=True,
                            env=env, cwd=ROOT)
    assert listed.returncode == 0
    for name in STUDIES:
        assert name in listed.stdout and get(name).CITATION in listed.stdout
    bad = subprocess.run([sys.executable, "-m", "numformer.studies", "no-such-study"], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "ln-placement" in bad.stderr


def test_cli_writes_the_picture_the_table_and_the_numbers(tmp_path):
    from numformer.studies.__main__ import main

    assert main(["output-change", "--small", "--out", str(tmp_path)]) == 0
    png, md, js = (tmp_path / f"output-change.{ext}" for ext in ("png", "md", "json"))
    assert png.read_bytes().startswith(b"\x89PNG")
    table = md.read_text()
    assert output_change.CITATION in table and "O(log N)" in table and "the finding holds" in table
    assert json.loads(js.read_text())["failed"] == []


def test_every_study_states_its_claim_shapes_finding_difference_command_and_time():
    for name in STUDIES:
        doc = get(name).__doc__
        for heading in ("Paper:", "Claim:", "Shapes and seeds", "What numformer found", "Where it differs:",
                        "Command:", "Time:"):
            assert heading in doc, (name, heading)
        assert f"python -m numformer.studies {name}" in doc
        # table3 trains 20 models one after the other (rows A, D, E and base, two seeds): about an hour;
        # hessian-blocks takes every block's spectrum twice, then every layer's and the products' precision: 10.6 min
        assert get(name).MINUTES <= {"table3": 60, "hessian-blocks": 12}.get(name, 10)
