"""The finite-difference step chosen per probe (issue 62, item 3; numformer/finite_differences/central_differences.py):
a probe that fails at h is measured again at h/2 and judged by Richardson's (4 D(h/2) - D(h)) / 3.

A smooth but strongly curved layer, ``y = sin(a * x)`` with large gains ``a`` (the trained-weights regime where
GELU failed one tensor of 161 at 1.57e-6), fails the fixed step h = 1e-5 on its input by the truncation term
``h^2 a^2 / 12`` (~8e-6 relative), a property of the check, and passes with the step chosen; its backward with a
planted error smaller than that truncation term, or a gross one, still fails. The refinement costs two forwards
per failing probe only."""
from __future__ import annotations

import numpy as np
import pytest

from numformer.finite_differences import GradCase, check, run_case
from numformer.module import Module, Parameter

RNG = np.random.default_rng(0)


class Sine(Module):
    """``y = sin(a * x)``, ``a`` (d,) one gain per feature, x (..., d) -> y (..., d). Smooth: ``kinks = False``.
    Backward: ``dx = dy * a cos(a x)``; ``da = sum over rows of dy * x cos(a x)``. Saved for backward: ``x``.
    ``bug``: None, ``"scale"`` (dx off by a factor 1 + 2e-5, below the fixed step's truncation error) or
    ``"chain"`` (dx without the inner derivative ``a``)."""

    kinks = False

    def __init__(self, gains, bug=None):
        super().__init__()
        self.a = Parameter(np.asarray(gains, dtype=np.float64))
        self.bug = bug

    def forward(self, x):
        self.save_for_backward(x=x)
        return np.sin(self.a.data * x)

    def backward(self, dy):
        x = self.pop_saved("x")
        c = np.cos(self.a.data * x)
        self.a.grad += (dy * x * c).reshape(-1, x.shape[-1]).sum(axis=0)
        if self.bug == "chain":
            return dy * c
        return dy * self.a.data * c * (1 + 2e-5 if self.bug == "scale" else 1.0)


GAINS = [700.0, -900.0, 1000.0, 800.0]


def sine_case(bug=None):
    x = RNG.standard_normal((2, 3, 4))
    return GradCase("Sine", "gains near 1000", Sine(GAINS, bug), {"x": x},
                    lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})


def results(bug=None, extrapolate=True):
    return {r.tensor: r for r in run_case(sine_case(bug), np.random.default_rng(1), extrapolate=extrapolate)}


def test_the_fixed_step_fails_a_right_curved_layer_and_the_chosen_step_passes_it():
    fixed, chosen = results(extrapolate=False), results()
    assert not fixed["input:x"].passed and 2e-6 < fixed["input:x"].max_rel_error < 1e-4  # truncation: h^2 a^2 / 12
    assert fixed["a"].passed and fixed["a"].refined == 0
    assert all(r.passed for r in chosen.values()), {n: r.max_rel_error for n, r in chosen.items()}
    assert chosen["input:x"].max_rel_error < 1e-8 and chosen["input:x"].refined > 0  # refined where it failed
    assert chosen["a"].refined == 0  # a passing probe is not measured again
    assert check(Sine(GAINS), RNG.standard_normal((2, 3, 4))).passed  # check() chooses the step as well


@pytest.mark.parametrize("bug", ["scale", "chain"])
def test_a_planted_bug_in_the_curved_layer_still_fails(bug):
    found = results(bug)
    assert not found["input:x"].passed and found["a"].passed
    assert found["input:x"].max_rel_error > (5e-6 if bug == "scale" else 0.1)
    assert not check(Sine(GAINS, bug), RNG.standard_normal((2, 3, 4))).passed


def test_refinement_costs_two_forwards_per_failing_probe_only():
    calls = []

    def counted(bug):
        case = sine_case(bug)
        forward = case.forward
        case.forward = lambda m, i: (calls.append(1), forward(m, i))[1]
        calls.clear()
        found = run_case(case, np.random.default_rng(1))
        return len(calls), sum(r.probes for r in found), sum(r.refined for r in found)
    plain, probes, refined = counted(None)
    assert plain == 1 + 2 * probes + 2 * refined  # the analytic pass, two forwards a probe, two a refined one
    buggy, probes, refined = counted("chain")
    assert buggy == 1 + 2 * probes + 2 * refined and refined == 24  # every input probe fails and is refined
