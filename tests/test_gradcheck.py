"""Every gradient check of grad_checks passes, and the checker itself catches planted bugs."""
import json
import subprocess
import sys

import numpy as np
import pytest

from grad_checks.cases import BUILDERS, build_cases
from numformer.gradcheck import rel_error, run_case
from numformer.layers import LayerNorm, ScaledDotProductAttention

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

    def wrong_backward(self, dy):
        xhat, rstd = self._cache_xhat, self._cache_rstd
        self.weight.grad += (dy * xhat).sum(axis=tuple(range(dy.ndim - 1)))
        self.bias.grad += dy.sum(axis=tuple(range(dy.ndim - 1)))
        dxhat = dy * self.weight.data
        return (dxhat - dxhat.mean(axis=-1, keepdims=True)) * rstd

    monkeypatch.setattr(LayerNorm, "backward", wrong_backward)
    results = {r.tensor: r for r in run_case(_layernorm_case(), np.random.default_rng(0))}
    assert results["weight"].passed and results["bias"].passed
    assert not results["input:x"].passed
    assert results["input:x"].max_rel_error > 1e-3


def test_checker_catches_a_missing_attention_scale(monkeypatch):
    """Forget the 1/sqrt(d_k) in the backward of Eq. 1: dq and dk must fail, dv must pass."""
    original = ScaledDotProductAttention.backward

    def unscaled(self, dout):
        scale = self._cache[-1]
        dq, dk, dv = original(self, dout)
        return dq / scale, dk / scale, dv

    monkeypatch.setattr(ScaledDotProductAttention, "backward", unscaled)
    case = build_cases(["ScaledDotProductAttention"])[0]
    results = {r.tensor: r for r in run_case(case, np.random.default_rng(0))}
    assert not results["input:q"].passed and not results["input:k"].passed
    assert results["input:v"].passed


def test_cli_json_and_layer_filter():
    out = subprocess.run([sys.executable, "-m", "grad_checks", "--json", "--layer", "Softmax", "--layer", "ReLU"],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["failed"] == 0 and report["checks"] == 2
    assert report["max_rel_error"] < 1e-6
    assert set(report["layers"]) == {"Softmax", "ReLU"}


def test_cli_unknown_layer_is_one_line_error():
    out = subprocess.run([sys.executable, "-m", "grad_checks", "--layer", "Conv2d"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "unknown layer 'Conv2d'" in out.stderr and "Traceback" not in out.stderr
