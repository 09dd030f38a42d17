"""GELU in its exact form (numformer/layers/gelu.py) and the error function it is built on (numformer/layers/erf.py):
erf and erfc against Python's math.erf / math.erfc over a dense grid (0, tiny, negative, |x| up to 10 and
beyond, float32 and float64), the forward and backward against their formulas on math.erf, a float64
finite-difference check, and ModelConfig.activation "gelu" reaching every feed-forward block. Parity with
PyTorch's F.gelu: tests/checks/test_torch_parity.py's generic cases (GELU, FeedForward-GELU, GELU-16x40x1024);
transformers' and CTranslate2's: tests/interop."""
import math

import numpy as np
import pytest

from grad_checks.cases import build_cases
from numformer.finite_differences import run_case
from numformer.layers import GELU, FeedForward
from numformer.layers import gelu as gelu_module
from numformer.layers.erf import depths, erf, erfc
from numformer.layers.gelu import gelu_backward, gelu_forward
from numformer.model import Transformer
from numformer.presets import get_preset

GRID = np.concatenate([np.linspace(-10, 10, 40001), np.geomspace(1e-300, 12, 3000), -np.geomspace(1e-300, 12, 3000),
                       [0.0, -0.0, 5e-324, 1.9999999999999998, 2.0, 2.0000000000000004, 26.0, 27.0, 30.0, 40.0, 1e300]])
ULPS = {np.float64: 8, np.float32: 10}  # measured at most 6 and 8


def ulps(got, exact, dtype):
    """|got - exact| in units of the last place of ``exact`` in ``dtype`` (exact given in float64)."""
    spacing = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_erf_is_accurate_to_a_few_ulps(dtype):
    x = GRID[np.abs(GRID) < np.finfo(dtype).max].astype(dtype)
    with np.errstate(under="ignore"):
        got = erf(x)
    exact = np.array([math.erf(float(v)) for v in x])
    assert got.dtype == dtype
    worst = ulps(got, exact, dtype)
    print(f"\n{np.dtype(dtype)}: erf worst {worst.max():.1f} ulp at x = {x[worst.argmax()]!r}, "
          f"series/fraction depths {depths(dtype)}")
    assert worst.max() <= ULPS[dtype]
    assert erf(np.array([0.0], dtype))[0] == 0 and np.signbit(erf(np.array([-0.0], dtype))[0])  # odd, exactly
    assert erf(np.array([np.inf, -np.inf], dtype)).tolist() == [1, -1] and np.isnan(erf(np.array([np.nan], dtype)))


def test_erfc_is_accurate_relative_to_its_size_in_the_tail():
    """Beyond the split point erfc comes from the continued fraction, accurate however small it is (the GELU's
    gate far below 0); below it 1 - erf, accurate to a few ulp(1) absolute."""
    x = GRID[(GRID > 0) & (GRID < 26.5)]
    with np.errstate(under="ignore"):
        got = erfc(x)
    exact = np.array([math.erfc(float(v)) for v in x])
    tail = x > 2  # the split point itself is the series'
    assert ulps(got[tail], exact[tail], np.float64).max() <= 8
    assert np.abs(got[~tail] - exact[~tail]).max() <= 4 * np.finfo(np.float64).eps  # measured 3
    assert np.array_equal(erfc(-x), 2 - got)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_forward_and_backward_are_the_formulas(dtype):
    x = np.linspace(-12, 12, 961).astype(dtype)
    phi_cdf = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    density = np.exp(-0.5 * x.astype(np.float64) ** 2) / math.sqrt(2 * math.pi)
    dy = np.random.default_rng(0).standard_normal(x.shape).astype(dtype)
    m = GELU()
    y = m(x)
    dx = m.backward(dy)
    assert y.dtype == dx.dtype == dtype and not m.saved  # backward frees what forward kept
    tol = 8 * np.finfo(dtype).eps
    # absolute: for -2 sqrt 2 < x < 0 the gate is 1 - erf, accurate to a few ulp(1), not relative to its size
    np.testing.assert_allclose(y, x * phi_cdf, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, dy * (phi_cdf + x * density), rtol=tol, atol=tol)
    m.eval()
    m(x)
    assert not m.saved  # eval mode keeps nothing
    assert GELU.kinks is False


def test_the_gate_keeps_its_relative_accuracy_far_below_zero():
    """Phi(-10) = 7.6e-24: from erfc, not from 1 + erf (which is 0 there)."""
    y, gate = gelu_forward(np.array([-10.0, -20.0]))
    exact = [0.5 * math.erfc(10 / math.sqrt(2)), 0.5 * math.erfc(20 / math.sqrt(2))]
    np.testing.assert_allclose(gate, exact, rtol=1e-13)
    np.testing.assert_allclose(y, [-10 * exact[0], -20 * exact[1]], rtol=1e-13)


def test_the_finite_differences_agree_and_catch_a_planted_wrong_derivative(monkeypatch):
    """The grad-check cases made from the table's row (GELU alone, |x| up to 30 and 0; the feed-forward network
    with it) pass in float64; with the density's factor x dropped from the backward they fail."""
    cases = build_cases(["GELU"])
    assert {c.layer for c in cases} == {"GELU", "FeedForward"}
    for case in cases:
        results = run_case(case, np.random.default_rng(1))
        assert results and all(r.passed for r in results), [(r.tensor, r.max_rel_error) for r in results]

    def wrong(dy, x, gate):  # the product rule's second term without its x
        return dy * (gate + np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))

    monkeypatch.setattr(gelu_module, "gelu_backward", wrong)
    for case in build_cases(["GELU"]):
        assert not all(r.passed for r in run_case(case, np.random.default_rng(1))), case.case


def test_the_activation_reaches_every_feed_forward_block():
    cfg = get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, activation="gelu")
    ffns = [m for m in Transformer(cfg).modules() if isinstance(m, FeedForward)]
    assert len(ffns) == 4 and all(type(f.activation) is GELU for f in ffns)
    assert gelu_backward(np.ones(1), np.zeros(1), np.full(1, 0.5))[0] == 0.5  # derivative 1/2 at 0
