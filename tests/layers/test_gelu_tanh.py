"""GELU's tanh form (numformer/layers/gelu_tanh.py): the forward and backward against the tanh formulas, the
gate without overflow, within 1e-3 of the exact GELU, a float64 finite-difference check that catches a
planted wrong derivative, and ModelConfig.activation "gelu_tanh" reaching every feed-forward block. Parity with
F.gelu(approximate="tanh"), transformers' gelu_new / gelu_pytorch_tanh and CTranslate2's GELUTanh: the generic
cases made from the table's row (tests/checks/test_torch_parity.py, tests/interop, tests/layers/test_activations.py)."""
import math

import numpy as np
import pytest

from grad_checks.cases import build_cases
from numformer.finite_differences import run_case
from numformer.layers import GELU, GELUTanh, FeedForward
from numformer.layers import gelu_tanh as gelu_tanh_module
from numformer.model import Transformer
from numformer.presets import get_preset

C, K = math.sqrt(2 / math.pi), 0.044715


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_forward_and_backward_are_the_tanh_formulas(dtype):
    x = np.linspace(-12, 12, 961).astype(dtype)
    x64 = x.astype(np.float64)
    u = [C * (v + K * v ** 3) for v in x64]
    half = np.array([1 / (1 + math.exp(-2 * v)) for v in u])   # (1 + tanh u) / 2, without 1 + tanh's cancellation
    sech2 = np.array([1 / math.cosh(v) ** 2 for v in u])         # 1 - tanh^2 u, likewise
    dy = np.random.default_rng(0).standard_normal(x.shape).astype(dtype)
    m = GELUTanh()
    y = m(x)
    dx = m.backward(dy)
    assert y.dtype == dx.dtype == dtype and not m.saved
    tol = 8 * np.finfo(dtype).eps
    np.testing.assert_allclose(y, x64 * half, rtol=tol, atol=tol * 1e-3)
    local = half + 0.5 * x64 * sech2 * C * (1 + 3 * K * x64 * x64)
    # 1 - g for g near 1 is exact to ulp(1) only, times x du/dx (up to 10 at x = 3): absolute
    np.testing.assert_allclose(dx, dy * local, rtol=tol, atol=16 * tol)
    assert GELUTanh.kinks is False


def test_the_gate_neither_overflows_and_is_close_to_the_exact_form():
    x = np.array([-1e4, -50.0, -5.0, 0.0, 5.0, 50.0, 1e4])
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        y = GELUTanh().eval()(x)
    assert np.isfinite(y).all() and y[3] == 0 and y[-1] == 1e4 and y[0] == 0
    grid = np.linspace(-8, 8, 1601)
    assert np.abs(GELUTanh().eval()(grid) - GELU().eval()(grid)).max() < 1e-3  # an approximation of it


def test_the_finite_differences_agree_and_catch_a_planted_wrong_derivative(monkeypatch):
    cases = build_cases(["GELUTanh"])
    assert {c.layer for c in cases} == {"GELUTanh", "FeedForward"}
    for case in cases:
        results = run_case(case, np.random.default_rng(1))
        assert results and all(r.passed for r in results), [(r.tensor, r.max_rel_error) for r in results]

    def wrong(dy, x, gate):  # the sigmoid's derivative taken through u instead of 2u
        return dy * (gate + x * gate * (1 - gate) * C * (1 + 3 * K * x * x))

    monkeypatch.setattr(gelu_tanh_module, "gelu_tanh_backward", wrong)
    for case in build_cases(["GELUTanh"]):
        assert not all(r.passed for r in run_case(case, np.random.default_rng(1))), case.case


def test_the_activation_reaches_every_feed_forward_block():
    cfg = get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, activation="gelu_tanh")
    ffns = [m for m in Transformer(cfg).modules() if isinstance(m, FeedForward)]
    assert len(ffns) == 4 and all(type(f.activation) is GELUTanh for f in ffns)
