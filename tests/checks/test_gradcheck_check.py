"""numformer.finite_differences.check(layer, *inputs): the finite-difference check of any object with the layer contract,
in three lines: it passes numformer's layers (inputs, parameters, masks, ids, losses, dropout replayed), fails a
planted bug, turns a layer's own errors into one line, and leaves the caller's layer untouched."""
import numpy as np
import pytest

from numformer.backend import RandomState
from numformer.finite_differences import CheckReport, check
from numformer.layers import Dropout, Embedding, LayerNorm, MultiHeadAttention, ReLU
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.module import Parameter

RNG = np.random.default_rng(0)


class RMSNorm:
    """A layer that is not a numformer Module: y = x / rms(x) * g, rms(x) = sqrt(mean(x^2) + eps)."""

    def __init__(self, d, bug=False):
        self.g = Parameter(np.random.default_rng(1).standard_normal(d))
        self.bug = bug

    def forward(self, x):
        self.x, self.r = x, 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        return x * self.r * self.g.data

    def backward(self, dy):
        xhat = self.x * self.r
        self.g.grad += (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        dxhat = dy * self.g.data
        if self.bug:  # the term through r dropped
            return self.r * dxhat
        return self.r * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True))


def test_a_layer_written_by_hand_passes_and_prints_a_table():
    report = check(RMSNorm(6), RNG.standard_normal((2, 3, 6)))
    assert isinstance(report, CheckReport) and report.passed
    assert [r.tensor for r in report.results] == ["g", "input:x"]
    text = str(report)
    assert "tensor" in text and "worst rel err" in text and "passed: 2 tensors" in text


def test_a_planted_bug_fails_on_the_input_only():
    report = check(RMSNorm(6, bug=True), RNG.standard_normal((2, 3, 6)))
    assert not report.passed
    assert [r.tensor for r in report.failed] == ["input:x"]
    assert "FAILED (1 of 2 tensors)" in str(report)


def test_numformer_layers_masks_ids_and_losses():
    mask = np.ones((2, 1, 1, 5), bool)
    mask[1, ..., 3:] = False
    mha = MultiHeadAttention(8, 2)
    report = check(mha, RNG.standard_normal((2, 4, 8)), RNG.standard_normal((2, 5, 8)), mask=mask)
    assert report.passed and {"input:x", "input:memory", "w_q.weight"} <= {r.tensor for r in report.results}
    assert check(Embedding(10, 4), RNG.integers(0, 10, (2, 3))).passed  # ids pass through, the weight is checked
    target = RNG.integers(0, 13, (2, 3))
    assert check(LabelSmoothedCrossEntropy(0.1), RNG.standard_normal((2, 3, 13)), target).passed  # backward()
    x = RNG.standard_normal((3, 4))
    x[np.abs(x) < 1e-3] = 0.5
    assert check(ReLU(), x).passed


def test_dropout_masks_are_replayed_so_the_check_can_pass_and_fail():
    assert check(Dropout(0.5, RandomState(1)), RNG.standard_normal((4, 6))).passed

    class Unscaled(Dropout):
        def backward(self, dy):
            mask = self.pop_saved("mask")
            return dy * (mask != 0)

    assert not check(Unscaled(0.5, RandomState(1)), RNG.standard_normal((4, 6))).passed


def test_the_callers_layer_is_untouched():
    ln = LayerNorm(4)  # float32
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    report = check(ln, x)
    assert report.passed and any("cast to float64" in n for n in report.notes)
    assert ln.weight.data.dtype == np.float32 and not ln.weight.grad.any() and x.dtype == np.float32


@pytest.mark.parametrize("backward, needle", [
    (lambda self, dy: (_ for _ in ()).throw(NotImplementedError("write me")), "not implemented yet: NotImplementedError"),
    (lambda self, dy: (dy, dy), "returned 2 gradients for 1 float input (x)"),
    (lambda self, dy: dy[..., :2], "the gradient of input:x has shape (2, 3, 2), expected (2, 3, 6)"),
    (lambda self, dy: dy * np.nan, "the gradient of input:x holds NaN or inf at (0, 0, 0)"),
    (lambda self, dy: dy @ dy, "the layer raised ValueError at"),
])
def test_a_broken_layer_is_one_line(backward, needle):
    broken = type("Broken", (RMSNorm,), {"backward": backward})
    report = check(broken(6), RNG.standard_normal((2, 3, 6)))
    assert not report.passed and needle in report.error, report.error
    assert "\n" not in report.error and "Traceback" not in str(report)


class ForwardModeRMSNorm(RMSNorm):
    """The hand-written layer with forward mode, ``r_dot = -r^3 mean(x x_dot)``, ``y_dot = (x_dot r + x r_dot) g +
    x r g_dot``; the backward's tangent by the product rule (``tangent_bug``: r's tangent left out of it)."""

    def __init__(self, d, tangent_bug=False):
        super().__init__(d)
        self.tangent_bug = tangent_bug

    def jvp(self, x_dot):
        self.x_dot = x_dot
        self.r_dot = -self.r ** 3 * (self.x * x_dot).mean(-1, keepdims=True)
        return (x_dot * self.r + self.x * self.r_dot) * self.g.data + self.x * self.r * self.g.tangent

    def backward_jvp(self, dy, dy_dot):
        x, r, x_dot, r_dot = self.x, self.r, self.x_dot, 0 * self.r_dot if self.tangent_bug else self.r_dot
        xhat, xhat_dot = x * r, x_dot * r + x * r_dot
        self.g.grad_tangent += (dy_dot * xhat + dy * xhat_dot).reshape(-1, x.shape[-1]).sum(0)
        u, u_dot = dy * self.g.data, dy_dot * self.g.data + dy * self.g.tangent
        m, m_dot = (u * xhat).mean(-1, keepdims=True), (u_dot * xhat + u * xhat_dot).mean(-1, keepdims=True)
        dx_dot = r_dot * (u - xhat * m) + r * (u_dot - xhat_dot * m - xhat * m_dot)
        return self.backward(dy), dx_dot


def test_a_layer_with_forward_mode_gets_its_jvp_and_rop_checked_and_a_planted_bug_fails():
    x = RNG.standard_normal((2, 3, 6))
    report = check(ForwardModeRMSNorm(6), x)
    assert report.passed
    assert {"jvp along all", "jvp along g", "jvp along input:x", "R-op of g", "R-op of input:x"} <= {
        r.tensor for r in report.results}
    assert any("forward mode: jvp against differences of forward" in n for n in report.notes)
    failed = check(ForwardModeRMSNorm(6, tangent_bug=True), x).failed
    assert failed and all(r.tensor.startswith("R-op of") for r in failed)


def test_numformer_layers_and_the_loss_get_forward_mode_and_a_layer_without_it_is_named():
    assert any(r.tensor == "R-op of input:x" for r in check(LayerNorm(8), RNG.standard_normal((2, 3, 8))).results)
    target = RNG.integers(0, 13, (2, 3))
    loss = check(LabelSmoothedCrossEntropy(0.1), RNG.standard_normal((2, 3, 13)), target)
    assert loss.passed and any(r.tensor == "R-op of input:logits" for r in loss.results)
    plain = check(RMSNorm(6), RNG.standard_normal((2, 3, 6)))
    assert any("no forward mode" in n and "refuse" in n for n in plain.notes)
