"""Kinks by contract (issue 62, item 2): a piecewise layer declares its pieces through the layer contract
(``kinks = True``, ``active_set``, ``forward_on_pieces``: numformer/module.py's Module), and the tools that
differentiate through it use that, never a class test.

A leaky ReLU written here, nowhere in numformer, built into a Transformer in ReLU's place: its Hessian-vector
products (numformer/curvature/hvp.py, from numformer's backward with the pieces held) equal second differences
of the loss itself on the same pieces (no backward enters them), ``u^T (H v)`` against
``(L(+u+v) - L(+u-v) - L(-u+v) + L(-u-v)) / 4h^2``, by differences and, from its jvp and backward_jvp on the
forward's pieces, exactly. Planted: a forward_on_pieces that holds the wrong function
(ReLU's ``x * S``) or saves the wrong pieces for backward is caught; the same layer without the declaration is
refused in one line, and so is one declaring kinks without its pieces. The finite-difference check drops the
probes that straddle its declared kinks; undeclared, it checks it as smooth, says so, and those probes fail."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from numformer.activations import ACTIVATIONS
from numformer.curvature.hvp import BlockHessian
from numformer.finite_differences import check
from numformer.kernels import kernel_mode
from numformer.layers import ReLU
from numformer.layers.registry import replaced
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.module import Module, UndeclaredKinks, tapped
from numformer.presets import ModelConfig

ALPHA = 0.1  # the slope of the negative piece
PAD = 0
BLOCK = ["decoder.layers.0.ffn.w_1.weight", "decoder.layers.0.ffn.w_1.bias", "encoder.layers.1.ffn.w_1.bias"]


class LeakyReLU(Module):
    """``y = x`` where ``x > 0``, ``ALPHA x`` elsewhere; shapes any -> same. Two pieces: ``kinks = True``.
    Saved for backward: ``positive``, the active set ``[x > 0]`` (also :attr:`active_set`); ``dx = dy * (1 where
    positive, ALPHA elsewhere)``."""

    kinks = True

    def forward(self, x):
        positive = x > 0
        self.save_for_backward(positive=positive)
        return np.where(positive, x, ALPHA * x)

    @property
    def active_set(self):
        return self.saved.get("positive")

    def forward_on_pieces(self, x, pieces):
        """The forward held on ``pieces`` (bool, x's shape): ``x * (1 where pieces, ALPHA elsewhere)``."""
        self.save_for_backward(positive=pieces)
        return x * np.where(pieces, 1.0, ALPHA)

    def backward(self, dy):
        return dy * np.where(self.pop_saved("positive"), 1.0, ALPHA)

    def jvp(self, x_dot):
        """On the forward's pieces: ``x_dot * (1 where positive, ALPHA elsewhere)``."""
        return x_dot * np.where(self.peek_saved("positive"), 1.0, ALPHA)

    def backward_jvp(self, dy, dy_dot):
        dx_dot = dy_dot * np.where(self.peek_saved("positive"), 1.0, ALPHA)
        return self.backward(dy), dx_dot


class HeldAsReLU(LeakyReLU):
    """Planted: holds the pieces as ReLU does (``x * S``), a function that is not this layer's."""

    def forward_on_pieces(self, x, pieces):
        self.save_for_backward(positive=pieces)
        return x * pieces


class SavesNoPieces(LeakyReLU):
    """Planted: the held forward is right but saves every element on the positive piece for backward."""

    def forward_on_pieces(self, x, pieces):
        self.save_for_backward(positive=np.ones_like(pieces))
        return x * np.where(pieces, 1.0, ALPHA)


class Undeclared(Module):
    """The same layer with the declaration removed (Module's ``kinks = None``)."""

    forward, backward = LeakyReLU.forward, LeakyReLU.backward


class KinksWithoutPieces(Undeclared):
    """Declares kinks but gives neither its active set nor the held forward."""

    kinks = True


def leaky_model(cls=LeakyReLU):
    cfg = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32, pad_id=PAD)
    with replaced({"ReLU": cls}):
        model = Transformer(cfg, seed=1, dtype=np.float64)
    assert any(isinstance(m, cls) for m in model.modules()) and not any(type(m) is ReLU for m in model.modules())
    return model


def batch():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 13, (3, 6)), rng.integers(1, 13, (3, 6))
    src[1, 4:], tgt[2, 3:] = PAD, PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def second_difference(model, data, u, v, pieces, h=1e-3) -> float:
    """``u^T H v`` from four losses at theta +- h u +- h v (no backward), every leaky ReLU held on ``pieces``
    by a tap of this test (``x * (1 where S, ALPHA elsewhere)``, not the layer's own forward_on_pieces)."""
    params = dict(model.named_parameters())
    crit = LabelSmoothedCrossEntropy(model.cfg.label_smoothing, PAD)
    src, tgt_in, tgt_out = data

    def loss(su, sv):
        saved = {n: params[n].data.copy() for n in BLOCK}
        start = 0
        for n in BLOCK:
            k = params[n].size
            params[n].data += (su * h * u[start:start + k] + sv * h * v[start:start + k]).reshape(params[n].shape)
            start += k
        try:
            with tapped(pieces, forward=lambda m, run, x: x * np.where(pieces[m], 1.0, ALPHA)):
                return float(crit.forward(model(src, tgt_in), tgt_out))
        finally:
            for n in BLOCK:
                params[n].data[...] = saved[n]
    return (loss(1, 1) - loss(1, -1) - loss(-1, 1) + loss(-1, -1)) / (4 * h * h)


def pieces_at_the_point(model, data) -> dict:
    """{leaky ReLU: its active set at the point}, read through the contract after a training forward."""
    found = {}
    layers = [m for m in model.modules() if m.kinks]
    model.train()
    with tapped(layers, forward=lambda m, run, x: (run(x), found.__setitem__(m, m.active_set))[0]):
        model(data[0], data[1])
    model.clear_cache()
    return found


def hessian_error(cls, method="differences") -> float:
    """max over a few (u, v) of |u^T (H v) from BlockHessian (by ``method``) - the loss's second difference| /
    (|u| |H v|), the model built with activation ``cls`` and the reference taken on LeakyReLU's pieces and
    function."""
    model, data = leaky_model(cls), batch()
    pieces = pieces_at_the_point(model, data)
    assert pieces and all(s.dtype == bool and 0 < s.mean() < 1 for s in pieces.values())  # both pieces in use
    rng = np.random.default_rng(5)
    worst = 0.0
    with kernel_mode("plain"):
        hessian = BlockHessian(model, data, BLOCK, method=method)
        for _ in range(3):
            u, v = rng.standard_normal(hessian.dim), rng.standard_normal(hessian.dim)
            u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
            hv = hessian(v)
            theirs = second_difference(model, data, u, v, pieces)
            worst = max(worst, abs(float(u @ hv) - theirs) / float(np.linalg.norm(hv)))
    return worst


@pytest.mark.parametrize("method", ["differences", "exact"])
def test_a_declared_leaky_relu_gets_right_hessian_vector_products(method):
    assert hessian_error(LeakyReLU, method) < 1e-6  # the second difference's own error: ~1e-8 at h = 1e-3


@pytest.mark.parametrize("planted", [HeldAsReLU, SavesNoPieces])
def test_a_wrong_forward_on_pieces_is_caught(planted):
    assert hessian_error(planted) > 1e-3


def test_an_undeclared_or_half_declared_kinked_layer_is_refused_in_one_line():
    with pytest.raises(UndeclaredKinks) as refused:
        BlockHessian(leaky_model(Undeclared), batch(), BLOCK, method="differences")
    line = str(refused.value)
    assert "\n" not in line and "Undeclared (encoder.layers.0.ffn.activation)" in line
    assert "kinks = False" in line and "kinks = True with active_set and forward_on_pieces" in line
    with pytest.raises(UndeclaredKinks, match="declares kinks = True but does not provide its pieces"):
        BlockHessian(leaky_model(KinksWithoutPieces), batch(), BLOCK, method="differences")
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_layer_numformer_builds_declares(activation):
    """Every leaf of the models numformer builds, with each activation of the table (numformer/activations.py),
    says kinks True or False (ReLU alone True), so the Hessian tools accept them all."""
    cfg = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=1, dropout=0.1, max_len=32,
                      activation=activation)
    for kw in (dict(), dict(pre_norm=True, positional="learned", tie_embeddings=False)):
        model = Transformer(dataclasses.replace(cfg, **kw), seed=1)
        assert {type(m).__name__ for m in model.modules() if m.kinks} == ({"ReLU"} if activation == "relu" else set())
        assert all(m.kinks is not None for m in model.modules() if not list(m.named_children()))
    model = Transformer(dataclasses.replace(cfg, dropout=0.0), seed=1, dtype=np.float64)
    BlockHessian(model, batch(), ["decoder.layers.0.ffn.w_1.bias"])  # accepted


def test_the_finite_difference_check_drops_probes_across_declared_kinks_only():
    x = np.random.default_rng(3).standard_normal((4, 6))
    x[0, :3] = [2e-6, -3e-6, 0.0]  # within the step of the kink at 0
    declared = check(LeakyReLU(), x)
    assert declared.passed and declared.results[0].kinks == 3
    assert not [n for n in declared.notes if "kinks" in n]  # declared: nothing said of them
    # forward mode too: the entries whose move crosses the kink (the one at 0 always) are left out of each probe
    rows = [r for r in declared.results if r.tensor.startswith(("jvp along", "R-op of"))]
    assert rows and all(r.passed and r.probes > 0 for r in rows) and all(r.kinks >= 1 for r in rows)
    undeclared = check(Undeclared(), x)
    assert any("Undeclared declares no kinks: checked as smooth" in n for n in undeclared.notes)
    assert not undeclared.passed and undeclared.results[0].kinks == 0  # the probes across the kink fail
    assert "declares kinks = True but does not provide its pieces" in check(KinksWithoutPieces(), x).error
