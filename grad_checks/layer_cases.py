"""The gradient checks of each layer alone (and the loss), in float64: one builder per layer, each returning
its GradCases (grad_checks/cases.py indexes them by layer name).

Inputs are random, with padding where the layer sees ids or masks (fully masked attention rows among them),
four heads, and dropout either off or replayed with a fixed mask. :func:`activation_cases` builds the cases of
every smooth activation of numformer's table (numformer.activations: SiLU, what a Marian opus-mt model
computes, GELU, ...), alone and in the feed-forward network, from its row alone.
"""
from __future__ import annotations

import numpy as np

from numformer.activations import ACTIVATIONS
from numformer.backend import RandomState
from numformer.finite_differences import GradCase
from numformer.layers import (Dropout, Embedding, FeedForward, LayerNorm, LearnedPositionalEmbedding, Linear,
                              MultiHeadAttention, OutputProjection, PositionalEncoding, ReLU, Residual,
                              ScaledDotProductAttention)
from numformer.layers.registry import layer_class
from numformer.layers.softmax import softmax as softmax_fn, softmax_backward, softmax_backward_jvp, softmax_jvp
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.module import Module

from .case_helpers import (B, D, F64, HEADS, PAD, S, T, V, Holder, _by_name, _merged, _replay, checks,
                           forward_mode, loss_forward_mode, padded_batch, padded_ids, residual_forward_mode, small_config)


@checks("Linear")
def linear(rng):
    m = Linear(7, 5, rng=rng, dtype=F64)
    m.bias.data[:] = rng.standard_normal(5)
    x = rng.standard_normal((B, 4, 7))
    return [GradCase("Linear", "3-d input", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


@checks("Embedding")
def embedding(rng):
    m = Embedding(V, D, rng=rng, dtype=F64)
    ids = padded_ids(rng, B, S, [S, 4, 2])
    ids[0, :3] = 5  # a repeated id: the scatter-add must sum its rows
    return [GradCase("Embedding", "repeated ids + padding", m, {},
                     lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1], **forward_mode())]


@checks("OutputProjection")
def projection(rng):
    m = OutputProjection(D, V, rng=rng, dtype=F64)
    h = rng.standard_normal((B, T, D))
    return [GradCase("OutputProjection", "logits", m, {"h": h},
                     lambda m, i: m(i["h"]), lambda m, g: {"h": m.backward(g[0])}, **forward_mode("h"))]


@checks("PositionalEncoding")
def positional(rng):
    m = PositionalEncoding(D, 32, dtype=F64)
    x = rng.standard_normal((B, S, D))
    return [GradCase("PositionalEncoding", "offset 3", m, {"x": x},
                     lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


@checks("LearnedPositionalEmbedding")
def learned_positions(rng):
    """The table alone at offset 3 (decoding's rows), and one table shared by a source and a target layer of
    different lengths (its gradient must collect both uses: added, never assigned)."""
    m = LearnedPositionalEmbedding(D, 32, dtype=F64, rng=rng)
    one = GradCase("LearnedPositionalEmbedding", "offset 3", m, {"x": rng.standard_normal((B, S, D))},
                   lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))
    src = LearnedPositionalEmbedding(D, 32, dtype=F64, rng=rng)
    tied = Holder(src=src, tgt=LearnedPositionalEmbedding(D, 32, dtype=F64, weight=src.weight))
    ins = {"x": rng.standard_normal((B, S, D)), "y": rng.standard_normal((B, T, D))}
    two = GradCase("LearnedPositionalEmbedding", "one table, two uses (S 6, T 5 at offset 1)", tied, ins,
                   lambda m, i: (m.src(i["x"]), m.tgt(i["y"], offset=1)),
                   lambda m, g: {"y": m.tgt.backward(g[1]), "x": m.src.backward(g[0])},
                   jvp=lambda m, t: (m.src.jvp(t["x"]), m.tgt.jvp(t["y"])),
                   backward_jvp=lambda m, g, gd: _merged(_by_name(("y",), m.tgt.backward_jvp(g[1], gd[1])),
                                                         _by_name(("x",), m.src.backward_jvp(g[0], gd[0]))))
    return [one, two]


@checks("Dropout")
def dropout(rng):
    rs = RandomState(7)
    m = Dropout(0.3, rs)
    x = rng.standard_normal((B, S, D))
    return [GradCase("Dropout", "p=0.3 fixed mask", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, before_forward=_replay(rs),
                     **forward_mode("x"))]


@checks("ReLU")
def relu(rng):
    m = ReLU()
    x = rng.standard_normal((B, S, D))
    x[np.abs(x) < 1e-3] = 0.5  # keep entries away from the kink, where the derivative is undefined
    return [GradCase("ReLU", "random", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


@checks("LayerNorm")
def layernorm(rng):
    m = LayerNorm(D, dtype=F64)
    m.weight.data[:] = rng.standard_normal(D)
    m.bias.data[:] = rng.standard_normal(D)
    x = 3.0 * rng.standard_normal((B, S, D)) + 1.0
    return [GradCase("LayerNorm", "random gain/bias", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


class SoftmaxFunction(Module):
    """Presents the functions softmax / softmax_backward (what attention runs) to the checker."""

    def forward(self, x):
        y = softmax_fn(x)
        self.save_for_backward(y=y)
        return y

    def backward(self, dy):
        return softmax_backward(dy, self.pop_saved("y"))

    def jvp(self, x_dot):
        y_dot = softmax_jvp(x_dot, self.peek_saved("y"))
        self.save_tangents(y=y_dot)
        return y_dot

    def backward_jvp(self, dy, dy_dot):
        y, y_dot = self.peek_saved("y"), self.pop_tangents("y")
        return self.backward(dy), softmax_backward_jvp(dy, dy_dot, y, y_dot)


@checks("Softmax")
def softmax(rng):
    m = SoftmaxFunction()
    x = 2.0 * rng.standard_normal((B, HEADS, T, S))
    return [GradCase("Softmax", "last axis", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


@checks("ScaledDotProductAttention")
def scaled_dot_product(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for name, tq, tk, mask in [("padding mask, Tq != Tk", T, S, src_mask), ("causal + padding", T, T, tgt_mask)]:
        m = ScaledDotProductAttention()
        ins = {"q": rng.standard_normal((B, HEADS, tq, 4)), "k": rng.standard_normal((B, HEADS, tk, 4)),
               "v": rng.standard_normal((B, HEADS, tk, 3))}
        out.append(GradCase("ScaledDotProductAttention", name, m, ins,
                            lambda m, i, mask=mask: m(i["q"], i["k"], i["v"], mask),
                            lambda m, g: dict(zip("qkv", m.backward(g[0]))), **forward_mode("q", "k", "v")))
    rs = RandomState(3)
    m = ScaledDotProductAttention(dropout=0.2, rng=rs)
    ins = {"q": rng.standard_normal((B, HEADS, T, 4)), "k": rng.standard_normal((B, HEADS, S, 4)),
           "v": rng.standard_normal((B, HEADS, S, 4))}
    out.append(GradCase("ScaledDotProductAttention", "attention dropout 0.2 fixed mask", m, ins,
                        lambda m, i: m(i["q"], i["k"], i["v"], src_mask),
                        lambda m, g: dict(zip("qkv", m.backward(g[0]))), before_forward=_replay(rs),
                        **forward_mode("q", "k", "v")))
    return out


@checks("MultiHeadAttention")
def multi_head(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    m = MultiHeadAttention.from_config(small_config(), rng, None, F64)
    x = rng.standard_normal((B, S, D))
    out.append(GradCase("MultiHeadAttention", "self, padding mask", m, {"x": x},
                        lambda m, i: m(i["x"], mask=src_mask), lambda m, g: {"x": m.backward(g[0])},
                        **forward_mode("x")))
    m = MultiHeadAttention.from_config(small_config(), rng, None, F64)
    y = rng.standard_normal((B, T, D))
    out.append(GradCase("MultiHeadAttention", "self, causal + padding", m, {"y": y},
                        lambda m, i: m(i["y"], mask=tgt_mask), lambda m, g: {"y": m.backward(g[0])},
                        **forward_mode("y")))
    m = MultiHeadAttention.from_config(small_config(d_k=3, d_v=5), rng, None, F64)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    out.append(GradCase("MultiHeadAttention", "encoder-decoder, d_k 3 d_v 5", m, ins,
                        lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                        lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))), **forward_mode("y", "memory")))
    return out


@checks("FeedForward")
def feedforward(rng):
    m = FeedForward.from_config(small_config(), rng, None, F64)
    for lin in (m.w_1, m.w_2):
        lin.bias.data[:] = 0.1 * rng.standard_normal(lin.bias.shape)
    x = rng.standard_normal((B, S, D))
    return [GradCase("FeedForward", "d_ff 16", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]


@checks("Residual")
def residual(rng):
    out = []
    for pre in (False, True):
        rs = RandomState(5)
        cfg = small_config(dropout=0.1, pre_norm=pre)
        hold = Holder(res=Residual.from_config(cfg, rs, F64), ffn=FeedForward.from_config(cfg, rng, None, F64))
        x = rng.standard_normal((B, S, D))
        out.append(GradCase("Residual", ("pre-LN" if pre else "post-LN") + " around FFN, dropout 0.1 fixed mask",
                            hold, {"x": x}, lambda m, i: m.res(i["x"], m.ffn),
                            lambda m, g: {"x": m.res.backward(g[0], m.ffn)}, before_forward=_replay(rs),
                            **residual_forward_mode()))
    return out

class _LossModule(Module):
    """Presents the loss (not a Module: it has no parameters) to the checker."""

    def __init__(self, smoothing):
        super().__init__()
        self.loss = LabelSmoothedCrossEntropy(smoothing, PAD)


@checks("LabelSmoothedCrossEntropy")
def loss(rng):
    tgt = padded_ids(rng, B, T, [T, 3, 1])
    m = _LossModule(0.1)
    logits = 2.0 * rng.standard_normal((B, T, V))
    return [GradCase("LabelSmoothedCrossEntropy", "eps 0.1, padding", m, {"logits": logits},
                     lambda m, i: m.loss.forward(i["logits"], tgt) * 1.0,
                     lambda m, g: {"logits": m.loss.backward() * g[0]}, **loss_forward_mode(m.loss))]

def activation_cases(name: str):
    """The builder of the activation ``name``'s cases (a row of numformer.activations.ACTIVATIONS, smooth: no
    kink, so nothing is kept away from 0): the layer alone on |x| up to 30 (where a gate saturates) with 0
    exactly, and the feed-forward network with it (SiLU is Marian's swish)."""
    row = ACTIVATIONS[name]

    def build(rng):
        m = layer_class(row.layer)()
        x = 3.0 * rng.standard_normal((B, S, D))
        x[0, 0, :5] = [-30.0, -8.0, 0.0, 8.0, 30.0]
        f = FeedForward.from_config(small_config(activation=name), rng, None, F64)
        for lin in (f.w_1, f.w_2):
            lin.bias.data[:] = 0.1 * rng.standard_normal(lin.bias.shape)
        return [GradCase(row.layer, "random, |x| up to 30", m, {"x": x},
                         lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x")),
                GradCase("FeedForward", f"d_ff 16, {row.layer}", f, {"x": rng.standard_normal((B, S, D))},
                         lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **forward_mode("x"))]

    build.__name__ = build.__qualname__ = name
    return build
