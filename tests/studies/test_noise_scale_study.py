"""The noise-scale study (numformer/studies/noise_scale.py, Gray et al. 2024): on its small configuration
(float64, a seed whose outcome is the same on every CPU configuration: the run is chaotic, and in float32 or
on another seed its outcome rides on the BLAS kernel) LayerNorm's gradient noise scale tracks the whole model's
over training in both placements; planted changes make the check fail: LayerNorm's series run
backwards in time (a noise scale that does not follow the total), and the groups' noise taken without the
per-sentence spread (tr(Sigma) from nothing but the mean gradient: no noise scale to track)."""
import math

import numpy as np
import pytest

from numformer.studies import noise_scale as study
from numformer.training.gradient_noise_scale import GROUPS


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def results():
    return study.measure(study.SMALL, log=_quiet)


def test_layernorm_tracks_the_total_in_both_placements(results):
    assert study.check(results) == []
    rows = {(r["placement"], r["group"]): r for r in study.findings(results)}
    for placement in study.PRE_NORM:
        ln = rows[placement, "layernorm"]
        assert ln["correlation"] > study.TRACK_MIN
        assert study.RATIO_BAND[0] < ln["median_ratio"] < study.RATIO_BAND[1]
        for group in GROUPS:  # every layer type and the stack-aware groups are measured
            assert math.isfinite(rows[placement, group]["last"])
        assert {"encoder self-attention", "decoder self-attention", "cross-attention", "encoder LayerNorm",
                "decoder LayerNorm"} <= {g for p, g in rows if p == placement}
    total = results["runs"]["post-LN"]["groups"]["total"]
    assert [row[0] for row in total] == list(range(study.SMALL.log_every, study.SMALL.steps + 1,
                                                   study.SMALL.log_every))


def test_the_small_run_does_not_ride_on_rounding(results):
    """SMALL's figures as measured under every row of tests/cpu_matrix.py (FMA or not, numpy's baseline loops, 1
    or 3 threads, plain kernels): the same to the third decimal. A change of the mechanism moves them."""
    assert study.SMALL.dtype == "float64"
    rows = {r["placement"]: r for r in study.findings(results) if r["group"] == "layernorm"}
    assert rows["post-LN"]["correlation"] == pytest.approx(0.877, abs=0.005)
    assert rows["pre-LN"]["correlation"] == pytest.approx(0.965, abs=0.005)
    assert rows["post-LN"]["median_ratio"] == pytest.approx(0.82, abs=0.01)
    assert rows["pre-LN"]["median_ratio"] == pytest.approx(0.89, abs=0.01)


def test_the_check_fails_when_layernorm_does_not_follow_the_total(results):
    planted = {**results, "runs": {p: {**run, "groups": {**run["groups"]}} for p, run in results["runs"].items()}}
    for run in planted["runs"].values():
        series = run["groups"]["layernorm"]
        run["groups"]["layernorm"] = [(step, g2, tr) for (step, _, _), (_, g2, tr) in zip(series, series[::-1])]
    failed = study.check(planted)
    assert len(failed) >= 2 and all("correlates" in f or "x the total" in f for f in failed), failed


def test_the_check_fails_without_the_per_sentence_spread(monkeypatch):
    real = study.grouped

    def no_spread(noise):  # tr(Sigma) of every group as if every sentence's gradient were the mean one
        return {g: (g2, 0.0 * tr) for g, (g2, tr) in real(noise).items()}
    monkeypatch.setattr(study, "grouped", no_spread)
    planted = study.measure(study.SMALL, log=_quiet)
    failed = study.check(planted)
    assert failed and all("layernorm" in f.lower() for f in failed), failed


def test_smoothing_divides_the_smoothed_terms():
    steps, b = study.smoothed([(1, 2.0, 4.0), (2, 4.0, 4.0)], ema=0.5)
    assert list(steps) == [1, 2] and np.allclose(b, [2.0, 4.0 / 3.0])
