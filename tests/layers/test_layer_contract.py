"""The layer contract (numformer/module.py): what a forward saves for its backward, readable by name, and taps
that observe or hold a layer for the length of a ``with`` block, never by replacing its methods.

A layer written only against the contract (RMSNorm, below: Zhang and Sennrich 2019, nowhere in numformer) and
built into a Transformer in LayerNorm's place gets, with no change to the tools, exact per-sentence gradient
statistics (equal to each sentence's gradient from a batch holding it alone) and Hessian-vector products (equal
to second differences of the loss itself, which no backward enters), exact from its jvp and backward_jvp and by
differences of gradients from its backward alone. Planted: each comparison fails for its mistake; a layer without
forward mode is refused by the exact products in one line."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from numformer.curvature.hvp import BlockHessian
from numformer.kernels import kernel_mode
from numformer.layers import Linear, ReLU
from numformer.layers.registry import replaced
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.module import Module, NoForwardMode, Parameter
from numformer.presets import ModelConfig
from numformer.training.per_sentence_gradients import PerSentenceGradients

B, S, T, V, PAD, D = 3, 6, 5, 13, 0, 8


class RMSNorm(Module):
    """``y = x / rms(x) * g`` over the last axis, ``rms(x) = sqrt(mean(x^2) + eps)``. Backward:
    ``dg = sum(dy * xhat)``; ``dx = r * (dxhat - xhat * mean(dxhat * xhat))`` with ``dxhat = dy * g``.
    Saved for backward: ``xhat`` and ``r`` (1 / rms). Smooth (eps > 0): ``kinks = False``, which the Hessian
    tools need said (Module.kinks)."""

    kinks = False

    def __init__(self, d: int, eps: float = 1e-5, dtype=np.float32):
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = Parameter(np.ones(d, dtype=dtype))

    def forward(self, x):
        r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)
        xhat = x * r
        self.save_for_backward(xhat=xhat, r=r)
        return xhat * self.weight.data

    def backward(self, dy):
        xhat, r = self.pop_saved("xhat", "r")
        self.weight.grad += (dy * xhat).reshape(-1, self.d).sum(axis=0)
        dxhat = dy * self.weight.data
        return r * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


class ForwardModeRMSNorm(RMSNorm):
    """RMSNorm with forward mode: ``r_dot = -r^2 mean(xhat x_dot)``, ``xhat_dot = r (x_dot - xhat mean(xhat
    x_dot))``, ``y_dot = xhat_dot g + xhat g_dot``; the backward's tangent, with ``u = dy g``, ``m = mean(u xhat)``:
    ``dg_dot = sum(dy_dot xhat + dy xhat_dot)``, ``dx_dot = r_dot (u - xhat m) + r (u_dot - xhat_dot m - xhat
    m_dot)``."""

    def jvp(self, x_dot):
        xhat, r = self.peek_saved("xhat", "r")
        r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
        xhat_dot = r * (x_dot - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
        self.save_tangents(xhat=xhat_dot, r=r_dot)
        return xhat_dot * self.weight.data + xhat * self.weight.tangent

    def backward_jvp(self, dy, dy_dot):
        (xhat, r), (xhat_dot, r_dot) = self.peek_saved("xhat", "r"), self.pop_tangents("xhat", "r")
        g, g_dot = self.weight.data, self.weight.tangent
        self.weight.grad_tangent += (dy_dot * xhat + dy * xhat_dot).reshape(-1, self.d).sum(axis=0)
        u, u_dot = dy * g, dy_dot * g + dy * g_dot
        m = (u * xhat).mean(axis=-1, keepdims=True)
        m_dot = (u_dot * xhat + u * xhat_dot).mean(axis=-1, keepdims=True)
        dx_dot = self.r_dot_term(r_dot, u, xhat, m) + r * (u_dot - xhat_dot * m - xhat * m_dot)
        return self.backward(dy), dx_dot

    @staticmethod
    def r_dot_term(r_dot, u, xhat, m):
        return r_dot * (u - xhat * m)


class ForgetfulRMSNorm(RMSNorm):
    """Planted: the backward leaves out the term through the rms (``dx = r * dxhat``)."""

    def backward(self, dy):
        xhat, r = self.pop_saved("xhat", "r")
        self.weight.grad += (dy * xhat).reshape(-1, self.d).sum(axis=0)
        return r * dy * self.weight.data


class ForgetfulTangentRMSNorm(ForwardModeRMSNorm):
    """Planted: the backward's tangent leaves out r's tangent."""

    @staticmethod
    def r_dot_term(r_dot, u, xhat, m):
        return 0 * r_dot


def rms_model(norm=RMSNorm):
    cfg = ModelConfig(vocab_size=V, d_model=D, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32, pad_id=PAD)
    with replaced({"LayerNorm": norm}):
        model = Transformer(cfg, seed=1, dtype=np.float64)
    assert any(isinstance(m, norm) for m in model.modules())
    return model


def batch():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, V, (B, S)), rng.integers(1, V, (B, T + 1))
    src[1, 4:], tgt[2, 3:] = PAD, PAD
    return src, tgt


def loss_and_backward(model, src, tgt, normalizer=None, backward=True) -> float:
    crit = LabelSmoothedCrossEntropy(0.1, PAD)
    loss = crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:], normalizer=normalizer)
    if backward:
        model.backward(crit.backward())
    return float(loss)


def norm_gains(model) -> list:
    return [n for n, p in model.named_parameters() if n.endswith("norm.weight")]


def per_sentence_error(model, normalize_per_sentence=False) -> float:
    """max over the RMSNorm gains and the sentences b of |the tap's |g_b|^2 - that of sentence b's gradient from
    a batch holding it alone (divided by the batch's token count)| / the latter."""
    src, tgt = batch()
    model.zero_grad()
    with kernel_mode("plain"), PerSentenceGradients(model) as tap:
        loss_and_backward(model, src, tgt)
    stats = tap.statistics()
    n_batch = int((tgt[:, 1:] != PAD).sum())
    worst = 0.0
    for b in range(B):
        s_len, t_len = int((src[b] != PAD).sum()), int((tgt[b] != PAD).sum())
        model.zero_grad()
        loss_and_backward(model, src[b:b + 1, :s_len], tgt[b:b + 1, :t_len],
                          normalizer=None if normalize_per_sentence else n_batch)
        grads = dict(model.named_parameters())
        for name in norm_gains(model):
            alone = float((grads[name].grad ** 2).sum())
            worst = max(worst, abs(float(stats[name].sq_norms[b]) - alone) / max(alone, 1e-30))
    return worst


def test_a_layer_written_against_the_contract_gets_per_sentence_statistics():
    assert per_sentence_error(rms_model()) < 1e-10


def test_the_comparisons_can_fail():
    """Planted: each sentence alone normalised by its own token count (not the batch's) fails the per-sentence
    comparison; an RMSNorm whose backward forgets the term through the rms fails the Hessian's by differences, one
    whose backward's tangent forgets r's tangent fails the exact one."""
    assert per_sentence_error(rms_model(), normalize_per_sentence=True) > 1e-3
    assert hessian_error(rms_model(ForgetfulRMSNorm), "differences") > 1e-3
    assert hessian_error(rms_model(ForgetfulTangentRMSNorm), "exact") > 1e-3


def test_a_layer_without_forward_mode_is_refused_by_the_exact_products_in_one_line():
    src, tgt = batch()
    with pytest.raises(NoForwardMode) as refused:
        BlockHessian(rms_model(RMSNorm), (src, tgt[:, :-1], tgt[:, 1:]), ["src_embed.weight"])
    line = str(refused.value)
    assert "\n" not in line and "RMSNorm (encoder.layers.0.self_attn_residual.norm) has no jvp of its own" in line
    assert "method='differences'" in line


def hessian_error(model, method) -> float:
    """|H (BlockHessian by ``method``: exact, or differences of numformer's backward) - H (second differences of
    the loss)| / |H| on the first RMSNorm gain of the decoder."""
    src, tgt = batch()
    name = next(n for n in norm_gains(model) if n.startswith("decoder"))
    with kernel_mode("plain"):
        hessian = BlockHessian(model, (src, tgt[:, :-1], tgt[:, 1:]), [name], method=method)
        mine = hessian.dense()
        p = dict(model.named_parameters())[name]
        h, n = 1e-4, p.size
        theirs = np.zeros((n, n))

        def loss_at(i, si, j, sj):
            saved = p.data.copy()
            p.data[i] += si * h
            p.data[j] += sj * h
            try:
                return loss_and_backward(model, src, tgt, backward=False)
            finally:
                p.data[...] = saved
        for i in range(n):
            for j in range(i, n):
                theirs[i, j] = theirs[j, i] = (loss_at(i, 1, j, 1) - loss_at(i, 1, j, -1) - loss_at(i, -1, j, 1)
                                               + loss_at(i, -1, j, -1)) / (4 * h * h)
    return float(np.abs(mine - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("method", ["exact", "differences"])
def test_a_layer_written_against_the_contract_gets_hessian_vector_products(method):
    assert hessian_error(rms_model(ForwardModeRMSNorm if method == "exact" else RMSNorm), method) < 1e-5


# -- the contract itself -----------------------------------------------------------------------------------
def test_saved_is_read_only_named_and_freed_by_backward_and_empty_in_eval():
    lin = Linear(3, 2, dtype=np.float64)
    x = np.ones((4, 3))
    lin(x)
    assert set(lin.saved) == {"x"} and lin.saved["x"].shape == (4, 3)
    with pytest.raises(TypeError):
        lin.saved["x"] = None  # a view: only the layer itself saves
    lin.backward(np.ones((4, 2)))
    assert not lin.saved
    with pytest.raises(RuntimeError, match="Linear.backward without a forward in training mode"):
        lin.backward(np.ones((4, 2)))
    lin.eval()
    lin(x)
    assert not lin.saved


def test_taps_observe_hold_nest_and_are_gone_after_the_block_even_on_an_error():
    relu, other = ReLU(), ReLU()
    x = np.array([-1.0, 2.0, -3.0])
    calls = []

    def outer(m, run, x):
        calls.append("outer")
        return run(x)

    def hold(m, run, x):  # holds the active set at all-positive: y = x
        calls.append("hold")
        m.save_for_backward(positive=np.ones_like(x, dtype=bool))
        return x
    with relu.tap(forward=hold), relu.tap(forward=outer):
        np.testing.assert_array_equal(relu(x), x)
        np.testing.assert_array_equal(relu.backward(np.ones(3)), np.ones(3))
        np.testing.assert_array_equal(other(x), [0.0, 2.0, 0.0])  # another instance is untouched
    assert calls == ["outer", "hold"]  # the last installed runs first
    np.testing.assert_array_equal(relu(x), [0.0, 2.0, 0.0])
    with contextlib.suppress(ZeroDivisionError), relu.tap(forward=lambda m, run, x: 1 / 0):
        relu(x)
    np.testing.assert_array_equal(relu(x), [0.0, 2.0, 0.0])
    assert "forward" not in vars(relu) and "backward" not in vars(relu)  # no method was put on the instance


def test_a_subclass_calling_super_is_tapped_once():
    class Doubled(ReLU):
        def forward(self, x):
            return 2 * super().forward(x)
    seen = []
    m = Doubled()
    with m.tap(forward=lambda mod, run, x: (seen.append(1), run(x))[1]):
        np.testing.assert_array_equal(m(np.array([1.0, -1.0])), [2.0, 0.0])
    assert seen == [1]


def test_tapped_puts_one_tap_on_many_layers_at_the_with_and_takes_them_all_off():
    from numformer.module import tapped

    relus = [ReLU(), ReLU(), ReLU()]
    seen = []

    def record(m, forward, x):
        seen.append(id(m))
        return forward(x)
    block = tapped(relus, forward=record)
    x = np.ones((2, 3))
    relus[0](x)
    assert seen == []  # made, not entered: no tap yet (BlockHessian's held sets rely on this)
    with pytest.raises(RuntimeError):
        with block:
            for r in relus:
                r(x)
            raise RuntimeError("inside the block")
    assert seen == [id(r) for r in relus]
    for r in relus:
        r(x)
    assert len(seen) == 3  # every one removed, after the error too


def test_an_untapped_layer_is_called_without_a_wrapper():
    """Taps cost nothing where none is installed: a layer's class holds its methods as written (no wrapper of
    module.py in between), a tap puts an attribute of the instance in front of them for its block only, and a
    whole model's forward and backward call no tap machinery (counted with cProfile)."""
    import cProfile
    import pstats

    lin = Linear(4, 3, rng=np.random.default_rng(0))
    assert Linear.forward.__code__.co_filename.endswith("linear.py")  # the method as written
    with lin.tap(forward=lambda m, run, x: run(x) * 2):
        assert "forward" in vars(lin) and "backward" not in vars(lin)
        x = np.ones((2, 4))
        np.testing.assert_allclose(lin(x), 2 * Linear.forward(lin, x))
    assert "forward" not in vars(lin) and lin._taps is None
    model = Transformer(ModelConfig(vocab_size=30, d_model=16, d_ff=32, heads=2, layers=1), seed=0)
    src = np.array([[5, 6, 7, 2]])
    profile = cProfile.Profile()
    profile.runcall(lambda: model.backward(np.ones_like(model(src, src))))
    called = {name for (path, _line, name) in pstats.Stats(profile).stats if path.endswith("module.py")}
    assert "_through_taps" not in called and "run" not in called
