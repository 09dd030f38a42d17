"""The forward-mode checks of ``python -m grad_checks`` (numformer/finite_differences/tangent_checks.py): every
case's JVP rows and R-op rows pass on numformer's layers, and a bug planted in each layer's jvp or in the tangent of
its backward fails its case; the tools refuse forward mode outside its contract in one line (a parameter without
a tangent, a layer without jvp, a backward_jvp without a jvp)."""
from __future__ import annotations

import numpy as np
import pytest

from grad_checks import layer_cases
from grad_checks.cases import build_cases
from numformer import loss as loss_module
from numformer.finite_differences.tangent_checks import TOLERANCE, run_tangent_case
from numformer.forward_mode import tangents
from numformer.layers import Linear
from numformer.layers import attention, dropout, embedding, gelu, gelu_tanh, layernorm, learned_positions, linear
from numformer.layers import projection, relu, silu, sublayer
from numformer.module import Module, NoForwardMode, NoTangent


def failing_rows(layer: str, case_part: str = "") -> list:
    """The rows that fail among the forward-mode rows of the cases of ``layer`` (whose name holds ``case_part``)."""
    rows = []
    for case in build_cases([layer]):
        if case_part in case.case and case.jvp is not None:
            rows += run_tangent_case(case, np.random.default_rng(0))
    assert rows, f"no forward-mode rows for {layer}"
    return [r for r in rows if not r.passed]


def test_every_case_has_forward_mode_and_passes():
    cases = build_cases()
    assert all(c.jvp is not None and c.backward_jvp is not None for c in cases), \
        [f"{c.layer}/{c.case}" for c in cases if c.jvp is None]
    worst = 0.0
    for case in cases:
        rows = run_tangent_case(case, np.random.default_rng(0))
        assert any(r.tensor.startswith("jvp along") for r in rows) and any(r.tensor.startswith("R-op of") for r in rows)
        assert all(r.passed for r in rows), [(case.layer, case.case, r.tensor, r.max_rel_error) for r in rows
                                             if not r.passed]
        worst = max(worst, max(r.max_rel_error for r in rows))
    assert worst < TOLERANCE / 2  # measured 2.0e-8 at seed 0 against 1e-7


def _orig(module, name):
    return getattr(module, name)


# (layer to check, its case's name part, module, function, the planted wrong function built from the right one)
PLANTED = {
    "linear_jvp: x W_dot dropped": ("Linear", "", linear, "linear_jvp",
                                    lambda f: lambda x, w, xd, wd, bd: f(x, w, xd, None, bd)),
    "linear_backward_jvp: dy W_dot^T dropped": ("Linear", "", linear, "linear_backward_jvp",
                                                lambda f: lambda dy, x, w, dyd, xd, wd, wt, bt: f(
                                                    dy, x, w, dyd, xd, None, wt, bt)),
    "layernorm_jvp: r_dot's sign": ("LayerNorm", "", layernorm, "layernorm_jvp",
                                    lambda f: lambda xd, xh, r, g, gd, bd: (lambda y, xhd, rd: (y, xhd, -rd))(
                                        *f(xd, xh, r, g, gd, bd))),
    "layernorm_backward_jvp: gamma_dot dropped": ("LayerNorm", "", layernorm, "layernorm_backward_jvp",
                                                  lambda f: lambda dy, dyd, xh, r, g, xhd, rd, gd, params=True: f(
                                                      dy, dyd, xh, r, g, xhd, rd, None, params)),
    # the Softmax case runs grad_checks' SoftmaxFunction, which holds the functions by name
    "softmax_jvp: the row sum's y forgotten": ("Softmax", "", layer_cases, "softmax_jvp",
                                               lambda f: lambda xd, y: y * (xd - xd.sum(axis=-1, keepdims=True))),
    "softmax_backward_jvp: c_dot's dy * y_dot term": ("Softmax", "", layer_cases, "softmax_backward_jvp",
                                                      lambda f: lambda dy, dyd, y, yd: f(dy, dyd, y, 0 * yd)
                                                      + yd * (dy - (dy * y).sum(-1, keepdims=True))),
    "attention_jvp: Q K_dot^T dropped": ("ScaledDotProductAttention", "causal", attention, "attention_jvp",
                                         lambda f: lambda q, k, v, p, pu, m, s, qd, kd, vd, dj=None: f(
                                             q, k, v, p, pu, m, s, qd, 0 * kd, vd, dj)),
    "attention_backward_jvp: P_dot doubled": ("ScaledDotProductAttention", "padding", attention,
                                              "attention_backward_jvp",
                                              lambda f: lambda do, dod, q, k, v, p, pu, m, s, qd, kd, vd, pd, pud,
                                              dj=None: f(do, dod, q, k, v, p, pu, m, s, qd, kd, vd, 2 * pd, pud, dj)),
    "silu_backward_jvp: the second derivative's factor 2": ("SiLU", "", silu, "silu_backward_jvp",
                                                            lambda f: lambda dy, dyd, x, s, xd: dyd * (s + x * s * (1 - s))
                                                            + dy * s * (1 - s) * (1 + x * (1 - 2 * s)) * xd),
    "gelu_backward_jvp: y'' as phi": ("GELU", "random", gelu, "gelu_backward_jvp",
                                      lambda f: lambda dy, dyd, x, g, xd: f(dy, dyd, x, g, 0 * xd)
                                      + dy * np.exp(-0.5 * x * x) / gelu.SQRT_2PI * xd),
    "gelu_tanh_jvp: dg/dx's factor 2": ("GELUTanh", "random", gelu_tanh, "gelu_tanh_jvp",
                                        lambda f: lambda xd, x, g: 0.5 * (f(xd, x, g) + xd * g)),
    "relu_backward in jvp: the active set ignored": ("ReLU", "", relu, "relu_backward",
                                                     lambda f: lambda dy, positive: dy),
    "Dropout.jvp: the mask ignored": ("Dropout", "", dropout.Dropout, "jvp",
                                      lambda f: lambda self, x_dot, add_dot=None: x_dot),
    "Embedding.jvp: the scale sqrt(d_model) dropped": ("Embedding", "", embedding.Embedding, "jvp",
                                                       lambda f: lambda self: f(self) / self.scale),
    "LearnedPositionalEmbedding.jvp: the rows from offset 0": (
        "LearnedPositionalEmbedding", "offset 3", learned_positions.LearnedPositionalEmbedding, "jvp",
        lambda f: lambda self, x_dot: x_dot + self.weight.tangent[:x_dot.shape[-2]]),
    "loss backward_jvp: the token weights": ("LabelSmoothedCrossEntropy", "", loss_module,
                                             "smoothed_cross_entropy_backward_jvp",
                                             lambda f: lambda p, w, zd: loss_module.softmax_jvp(zd, p)),
    "loss jvp: eps ignored": ("LabelSmoothedCrossEntropy", "", loss_module, "smoothed_cross_entropy_jvp",
                              lambda f: lambda p, y, eps, w, zd: f(p, y, 0.0, w, zd)),
}


@pytest.mark.parametrize("what", list(PLANTED))
def test_a_planted_bug_fails_its_forward_mode_check(what, monkeypatch):
    layer, case_part, module, name, wrong = PLANTED[what]
    monkeypatch.setattr(module, name, wrong(_orig(module, name)))
    assert failing_rows(layer, case_part), f"{what}: no row failed"


def test_a_composite_feeding_the_wrong_tangent_fails(monkeypatch):
    """Residual's pre-LN jvp without the residual path's tangent (add_dot): a composition bug."""
    right = sublayer.Residual.jvp

    def wrong(self, x_dot, sub, *arg_dots):
        if self.pre_norm:
            return self.dropout.jvp(sub.jvp(self.norm.jvp(x_dot), *arg_dots))
        return right(self, x_dot, sub, *arg_dots)
    monkeypatch.setattr(sublayer.Residual, "jvp", wrong)
    assert failing_rows("Residual", "pre-LN")


def test_the_projection_tangent_through_the_weight_is_checked(monkeypatch):
    right = projection.OutputProjection.backward_jvp

    def wrong(self, dlogits, dlogits_dot):
        self.weight.grad_tangent -= 0.5 * (dlogits.reshape(-1, self.vocab_size).T @ self.saved_tangents["h"].reshape(
            -1, self.d_model))
        return right(self, dlogits, dlogits_dot)
    monkeypatch.setattr(projection.OutputProjection, "backward_jvp", wrong)
    assert failing_rows("OutputProjection")


# -- refusals in one line -----------------------------------------------------------------------------------

def test_a_jvp_outside_a_tangents_block_is_one_line_saying_what_to_do():
    lin = Linear(3, 2, dtype=np.float64)
    lin(np.ones((4, 3)))
    with pytest.raises(NoTangent) as refused:
        lin.jvp(np.ones((4, 3)))
    assert "\n" not in str(refused.value) and "numformer.forward_mode.tangents" in str(refused.value)


def test_tangents_are_given_for_the_block_and_taken_back_even_on_an_error():
    lin = Linear(3, 2, dtype=np.float64)
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        with tangents(lin, {"nope": np.ones(2)}):
            pass
    with pytest.raises(ValueError, match=r"the tangent of bias has shape \(3,\), the parameter \(2,\)"):
        with tangents(lin, {"bias": np.ones(3)}):
            pass
    with pytest.raises(ZeroDivisionError), tangents(lin, {"bias": np.ones(2)}):
        assert np.array_equal(lin.bias.tangent, np.ones(2)) and not lin.weight.tangent.any()
        1 / 0
    with pytest.raises(NoTangent):
        lin.bias.tangent  # noqa: B018


def test_a_layer_without_forward_mode_refuses_in_one_line():
    class Doubler(Module):
        kinks = False

        def forward(self, x):
            return 2 * x

        def backward(self, dy):
            return 2 * dy
    with pytest.raises(NoForwardMode) as refused:
        Doubler().jvp(np.ones(3))
    assert "\n" not in str(refused.value) and "Doubler has no jvp of its own" in str(refused.value)


def test_backward_jvp_without_a_jvp_after_the_forward_is_said_as_such():
    lin = Linear(3, 2, dtype=np.float64)
    with tangents(lin):
        lin(np.ones((4, 3)))
        with pytest.raises(RuntimeError, match="Linear.backward_jvp without a jvp after the forward"):
            lin.backward_jvp(np.ones((4, 2)), np.ones((4, 2)))
        lin(np.ones((4, 3)))
        lin.jvp(np.ones((4, 3)))
        lin(np.ones((4, 3)))  # a new forward: the earlier jvp's tangents are gone with its saved tensors
        with pytest.raises(RuntimeError, match="without a jvp"):
            lin.backward_jvp(np.ones((4, 2)), np.ones((4, 2)))
