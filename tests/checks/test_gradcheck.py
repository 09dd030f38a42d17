"""Every gradient check of grad_checks passes, and the checker itself catches planted bugs."""
import json
import subprocess
import sys

import numpy as np
import pytest

from grad_checks.cases import BUILDERS, build_cases
from numformer.finite_differences import GradCase, rel_error, run_case
from numformer.kernels import kernel_mode
from numformer.layers import ReLU, attention, layernorm

CASES = build_cases(seed=0)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.layer}:{c.case}" for c in CASES])
def test_case_passes(case):
    results = run_case(case, np.random.default_rng(1))
    assert results, "a case must check at least one tensor"
    bad = [(r.tensor, r.max_rel_error) for r in results if not r.passed]
    assert not bad, f"{case.layer} ({case.case}): {bad}"
    assert max(r.max_rel_error for r in results) < 1e-6


def test_every_layer_has_a_check():
    layers = {c.layer for c in CASES}
    for name in BUILDERS:
        assert any(name in layer for layer in layers), name


def test_inputs_are_checked_not_only_parameters():
    tensors = {(c.layer, r.tensor) for c in CASES if c.inputs for r in run_case(c, np.random.default_rng(2))}
    for layer in ["Linear", "LayerNorm", "MultiHeadAttention", "EncoderLayer", "DecoderLayer", "Decoder"]:
        assert any(l == layer and t.startswith("input:") for l, t in tensors), layer


def test_rel_error_floor():
    assert rel_error(1.0, 1.0) == 0.0
    assert rel_error(1.0, -1.0) == 1.0
    assert rel_error(0.0, 1e-12, tiny=1e-3) == pytest.approx(1e-9)


def _layernorm_case():
    return [c for c in build_cases(["LayerNorm"])][0]


def test_checker_catches_a_wrong_layernorm_backward(monkeypatch):
    """Drop the xhat * mean(dxhat * xhat) term of LayerNorm's backward: the input check must fail."""

    def wrong_backward(dy, xhat, r, gamma):
        dxhat = dy * gamma
        return r * (dxhat - dxhat.mean(axis=-1, keepdims=True)), (dy * xhat).sum(axis=0), dy.sum(axis=0)

    monkeypatch.setattr(layernorm, "layernorm_backward", wrong_backward)
    with kernel_mode("plain"):
        results = {r.tensor: r for r in run_case(_layernorm_case(), np.random.default_rng(0))}
    assert results["weight"].passed and results["bias"].passed
    assert not results["input:x"].passed
    assert results["input:x"].max_rel_error > 1e-3


def test_checker_catches_a_missing_attention_scale(monkeypatch):
    """Forget the 1/sqrt(d_k) in the backward of Eq. 1: dq and dk must fail, dv must pass."""
    original = attention.attention_backward

    def unscaled(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
        dq, dk, dv = original(dout, q, k, v, p, p_used, masked, scale, dropout_backward)
        return dq / scale, dk / scale, dv

    monkeypatch.setattr(attention, "attention_backward", unscaled)
    case = build_cases(["ScaledDotProductAttention"])[0]
    with kernel_mode("plain"):
        results = {r.tensor: r for r in run_case(case, np.random.default_rng(0))}
    assert not results["input:q"].passed and not results["input:k"].passed
    assert results["input:v"].passed


def test_checker_catches_masked_scores_getting_gradient(monkeypatch):
    """Delete ``dS[masked] = 0`` from the attention backward: a query whose keys are all masked
    has uniform weights that do not depend on q or k, yet its dS would then be non-zero.
    Every case holds such rows (an all-padding source row, a target row starting with padding),
    so the check of every layer that runs attention must fail. One case per layer, the first (every
    case of every layer passing unplanted is test_case_passes; all of them here took 165 s)."""

    original = attention.attention_backward
    layers = ["ScaledDotProductAttention", "MultiHeadAttention", "EncoderLayer", "DecoderLayer", "Encoder", "Decoder",
              "Transformer"]
    first = [build_cases([layer])[0] for layer in layers]

    def no_zeroing(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
        return original(dout, q, k, v, p, p_used, None, scale, dropout_backward)

    def failures(case):
        results = run_case(case, np.random.default_rng(0))
        return len(results), sum(not r.passed for r in results)

    with kernel_mode("plain"):
        assert [failures(case)[1] for case in first] == [0] * len(layers)
        monkeypatch.setattr(attention, "attention_backward", no_zeroing)
        for layer, case in zip(layers, first):
            checked, failed = failures(case)
            assert failed > 0, f"{layer} ({case.case}): {checked} tensors checked, none failed"


def test_a_tensor_whose_probes_all_hit_kinks_fails():
    """ReLU at exactly 0: every probe straddles the kink and is dropped; with no probe left the
    tensor must fail (no evidence is not a pass) and the dropped probes are counted."""
    m = ReLU()
    case = GradCase("ReLU", "all at the kink", m, {"x": np.zeros((2, 3))},
                    lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})
    (result,) = run_case(case, np.random.default_rng(0))
    assert result.probes == 0 and result.kinks == 6
    assert not result.passed


def test_sampled_entries_at_kinks_are_replaced():
    """A large tensor with some entries at the kink: the dropped probes are replaced by other entries,
    so the tensor still gets its full sample of measured probes."""
    m = ReLU()
    x = np.random.default_rng(3).standard_normal((10, 20))
    x[::2] = 0.0  # half of the entries sit on the kink
    case = GradCase("ReLU", "half at the kink", m, {"x": x},
                    lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})
    (result,) = run_case(case, np.random.default_rng(0), sample=8, directions=0)
    assert result.probes == 8 and result.kinks > 0
    assert result.passed


def test_cli_json_and_layer_filter():
    out = subprocess.run([sys.executable, "-m", "grad_checks", "--json", "--layer", "Softmax", "--layer", "ReLU"],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    # a tensor each in reverse mode; in forward mode each has a JVP row along all, along its input, and an R-op row
    assert report["failed"] == 0 and report["checks"] == 2 + 6 and report["forward_mode_checks"] == 6
    assert report["max_rel_error"] < 1e-6
    assert set(report["layers"]) == {"Softmax", "ReLU"}


def test_cli_unknown_layer_is_one_line_error():
    out = subprocess.run([sys.executable, "-m", "grad_checks", "--layer", "Conv2d"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "unknown layer 'Conv2d'" in out.stderr and "Traceback" not in out.stderr
