"""Parity with PyTorch: every layer, the whole model + loss, and Adam with the warmup schedule.

The reference is ``tests/reference/torch_mirror.py``, an independent PyTorch float64 implementation
loaded with numformer's weights. For each case, in float64 and in float32:

* numformer runs forward, then backward from a *random* upstream gradient (never ones);
* the mirror runs forward in float64 on the same weights and inputs (for the float32
  case: numformer's float32 weights and inputs, upcast) and autograd backpropagates
  the same upstream gradient;
* the outputs, every parameter gradient and every float input gradient must agree
  with ``rel(a, b) = norm(a - b) / norm(b)`` under ``TOL[dtype]`` *per tensor*.

Batches have padding, source and target of different lengths (S=6, T=5), and cases
with dropout replay numformer's masks in the mirror.

Nothing discontinuous is decided twice. In the float32 comparisons the mirror also replays
numformer's ReLU active sets: a pre-activation within float32's rounding of zero may fall on
the other side of it in float64 (one of 15.7 million in the small preset's case, on one CPU
and not another), and that one unit moves every gradient upstream of it by far more than
rounding, so the comparison would measure where a near-zero value fell, which depends on the
CPU's instructions and BLAS kernel, not on numformer. Replaying cannot hide a wrong ReLU:

* a ReLU backward that ignores its active set fails float32 parity
  (``test_planted_relu_backward_without_its_active_set_fails_float32_parity``);
* the float32 active sets must agree with the float64 ones except at entries within
  rounding of zero, and at no more than 1e-5 of all entries
  (``test_float32_relu_active_sets_differ_from_float64_only_at_rounding_level``), which a
  misplaced threshold breaks;
* float64 parity does not replay: there the mirror's ``F.relu`` decides for itself.

The measured worst relative error per dtype is printed at the end of the run ("worst error parity-float32 = ...") and
stored in the pytest cache (tests/worst_error.py).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from numformer.activations import ACTIVATIONS
from numformer.backend import RandomState
from numformer.layers import (Dropout, Embedding, FeedForward, LayerNorm, LearnedPositionalEmbedding, Linear,
                              MultiHeadAttention, OutputProjection, PositionalEncoding, ReLU, Residual,
                              ScaledDotProductAttention)
from numformer.layers.registry import layer_class
from numformer.layers.sublayer import norm_layer
from numformer.kernels import kernel_mode
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Decoder, DecoderLayer, Encoder, EncoderLayer, Transformer
from numformer.module import Module
from numformer.norms import NORMS
from numformer.optim import Adam, NoamSchedule, clip_grad_norm
from numformer.presets import ModelConfig
from grad_checks.cases import (B, D, DFF, HEADS, MARIAN_PAD, PAD, S, T, V, Holder, SoftmaxFunction, as_marian_ids,
                               padded_batch, padded_ids, small_config)
from reference import torch_mirror as tm
from worst_error import record_worst


# The tolerances: norm(a - b) / norm(b) per tensor.
TOL = {"float64": 1e-9, "float32": 1e-4}
# Gradients that are mathematically zero are compared with an absolute bound on both
# norms instead (a relative error of two round-off noises means nothing). The only
# such tensors here are the key-projection biases ``w_k.bias``: q . b_k adds the same
# constant to every score of a query row, and softmax is invariant to that, so
# dL/db_k = 0 exactly in exact arithmetic; both implementations return round-off noise,
# which grows with the size of the sums: the bound is relative to the norm of the same
# projection's weight gradient (and absolute below a norm of 1).
ZERO_GRAD_SUFFIXES = ("w_k.bias",)
ZERO_ATOL = {"float64": 1e-12, "float32": 1e-5}
DTYPES = {"float64": np.float64, "float32": np.float32}


def rel(a, b) -> float:
    """norm(a - b) / norm(b), computed in float64; when norm(b) == 0 it is norm(a) (absolute)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    nb = float(np.linalg.norm(b))
    diff = float(np.linalg.norm(a - b))
    return diff if nb == 0.0 else diff / nb


# -- helpers ------------------------------------------------------------------------

def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def mirror_params(m: Module) -> tm.MirrorParams:
    """The torch mirror's leaves from ``m.named_parameters()`` (Linear weights transposed), and its frozen
    tensors from the persistent buffers (a logits bias: no gradient)."""
    linear = {_join(n, "weight") for n, mod in m.named_modules() if isinstance(mod, Linear)}
    return tm.MirrorParams([(n, p.data) for n, p in m.named_parameters()], linear,
                           frozen=m.named_buffers(persistent_only=True))


def recorded_decisions(m: Module, dropout: bool, relu: bool) -> dict:
    """What numformer decided in the last forward, by module name, as float64 torch tensors for the
    mirror's ``replay``: the Dropout masks (``dropout``) and the ReLU active sets (``relu``).

    Must be called after forward and before backward (backward clears the caches).
    """
    out = {}
    for n, mod in m.named_modules():
        if dropout and isinstance(mod, Dropout) and mod.saved.get("mask") is not None:
            out[n] = torch.from_numpy(np.asarray(mod.saved["mask"], dtype=np.float64))
        if relu and isinstance(mod, ReLU) and mod.active_set is not None:
            out[n] = torch.from_numpy(np.asarray(mod.active_set, dtype=np.float64))
    return out


def _t(a):
    return torch.from_numpy(np.asarray(a))


class _LossHolder(Module):
    """The loss has no parameters and is not a Module; this presents it to the runner."""

    def __init__(self, smoothing):
        super().__init__()
        self.crit = LabelSmoothedCrossEntropy(smoothing, PAD)


def _randomize(m: Module, rng, scale: float = 0.5) -> None:
    """Non-trivial biases and LayerNorm gains (zero biases / unit gains hide bugs)."""
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            p.data[...] = scale * rng.standard_normal(p.shape)
        elif name.endswith("norm.weight") or (name == "weight" and p.data.ndim == 1):  # LayerNorm gains
            p.data[...] = 1.0 + scale * rng.standard_normal(p.shape)


@dataclass
class Case:
    """One parity comparison.

    inputs: float arrays whose gradients are compared (cast to the case dtype);
    nf_forward(m, inputs) -> {output name: array};
    nf_backward(m, dys) -> {input name: gradient} for every name in inputs;
    torch_forward(P, tinputs, replay) -> {output name: tensor};
    seeded: outputs that receive a random upstream gradient (default: all).
    """

    module: Module
    inputs: dict
    nf_forward: Callable
    nf_backward: Callable
    torch_forward: Callable
    seeded: tuple | None = None
    record_dropout: bool = False  # replay numformer's dropout masks in the mirror
    criterion: object = None  # the loss nf_forward computes (its forward mode: tests/checks/test_forward_mode_parity.py)


# -- cases: each builder takes (rng, dtype) and returns a Case ------------------------

def case_linear(rng, dt):
    m = Linear(7, 5, rng=rng, dtype=dt)
    _randomize(m, rng)
    return Case(m, {"x": rng.standard_normal((B, 4, 7))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.linear(P, "", i["x"])})


def case_embedding(rng, dt):
    m = Embedding(V, D, rng=rng, dtype=dt)
    ids = padded_ids(rng, B, S, [S, 4, 2])
    ids[0, :3] = 5  # a repeated id: the scatter-add must sum its rows
    ids[2, 0] = 5
    return Case(m, {}, lambda m, i: {"y": m(ids)}, lambda m, g: (m.backward(g["y"]), {})[1],
                lambda P, i, d: {"y": tm.embedding(P, "", _t(ids), D)})


def case_output_projection(rng, dt):
    m = OutputProjection(D, V, rng=rng, dtype=dt)
    return Case(m, {"h": rng.standard_normal((B, T, D))},
                lambda m, i: {"logits": m(i["h"])}, lambda m, g: {"h": m.backward(g["logits"])},
                lambda P, i, d: {"logits": tm.output_projection(P, "", i["h"])})


def case_positional(rng, dt):
    m = PositionalEncoding(D, 32, dtype=dt)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"], offset=3)}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.positional(i["x"], offset=3)})


def case_positional_odd_width(rng, dt):
    m = PositionalEncoding(7, 16, dtype=dt)
    return Case(m, {"x": rng.standard_normal((B, S, 7))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.positional(i["x"])})


def case_learned_positions(rng, dt):
    m = LearnedPositionalEmbedding(D, 32, dtype=dt, rng=rng)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"], offset=3)}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.learned_positional(P, "", i["x"], offset=3)})


def case_learned_positions_shared(rng, dt):
    """One table used by a source (S rows from 0) and a target (T rows from 2): its gradient is the sum of both."""
    src = LearnedPositionalEmbedding(D, 16, dtype=dt, rng=rng)
    m = Holder(src=src, tgt=LearnedPositionalEmbedding(D, 16, dtype=dt, weight=src.weight))
    return Case(m, {"x": rng.standard_normal((B, S, D)), "y": rng.standard_normal((B, T, D))},
                lambda m, i: {"sx": m.src(i["x"]), "ty": m.tgt(i["y"], offset=2)},
                lambda m, g: {"y": m.tgt.backward(g["ty"]), "x": m.src.backward(g["sx"])},
                lambda P, i, d: {"sx": tm.learned_positional(P, "src", i["x"]),
                                 "ty": tm.learned_positional(P, "src", i["y"], offset=2)})


def case_embedding_pad_row(rng, dt):
    """The pad row's gradient rule against torch's ``F.embedding(padding_idx=...)``: pad (V - 1, Marian's) at the
    start of every row and at the ends, a repeated id."""
    m = Embedding(V, D, rng=rng, dtype=dt, padding_idx=MARIAN_PAD)
    ids = as_marian_ids(padded_ids(rng, B, S, [S, 4, 2]))
    ids[:, 0] = MARIAN_PAD
    ids[0, 1:4] = 5
    return Case(m, {}, lambda m, i: {"y": m(ids)}, lambda m, g: (m.backward(g["y"]), {})[1],
                lambda P, i, d: {"y": tm.embedding(P, "", _t(ids), D, padding_idx=MARIAN_PAD)})


def case_activation(rng, dt, name, shape=(B, S, D), extremes=True):
    """A smooth activation of numformer's table (SiLU, GELU, ...) against the function of
    ``torch.nn.functional`` the table names for the mirror; with ``extremes`` |x| up to 30 (a gate saturated)."""
    x = 3.0 * rng.standard_normal(shape)
    if extremes:
        x[0, 0, :4] = [-30.0, -8.0, 8.0, 30.0]
    return Case(layer_class(ACTIVATIONS[name].layer)(), {"x": x}, lambda m, i: {"y": m(i["x"])},
                lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.activation(None, "", i["x"], name)})


#: the smooth activations of the table (ReLU's cases keep away from its kink: case_relu, case_feedforward)
SMOOTH = [name for name in ACTIVATIONS if name != "relu"]


def case_relu(rng, dt):
    m = ReLU()
    x = rng.standard_normal((B, S, D))
    x[np.abs(x) < 1e-2] = 0.5  # away from the kink
    return Case(m, {"x": x}, lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": torch.nn.functional.relu(i["x"])})


def case_layernorm(rng, dt):
    m = LayerNorm(D, eps=1e-5, dtype=dt)
    m.weight.data[:] = rng.standard_normal(D)
    m.bias.data[:] = rng.standard_normal(D)
    return Case(m, {"x": 3.0 * rng.standard_normal((B, S, D)) + 1.0},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.layer_norm(P, "", i["x"], 1e-5)})


def case_norm(rng, dt, name):
    """A norm of numformer's table (numformer.norms) against the function of ``torch.nn.functional`` the table
    names for the mirror, every parameter random (LayerNorm's own case: case_layernorm)."""
    m = norm_layer(name, D, eps=1e-5, dtype=dt)
    for p in m.parameters():
        p.data[:] = rng.standard_normal(p.shape)
    return Case(m, {"x": 3.0 * rng.standard_normal((B, S, D)) + 1.0},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.normalise(P, "", i["x"], name, 1e-5)})


def norm_cases() -> dict:
    """The cases made from the norms' table, read now: each norm but LayerNorm (which has its own) alone and in the
    whole model, post-LN and pre-LN (every residual's norm and the final norms), dropout replayed."""
    made = {}
    for name in (n for n in NORMS if n != "layernorm"):
        layer = NORMS[name].layer
        made[layer] = lambda r, d, n=name: case_norm(r, d, n)
        made[f"Transformer-{layer}-post-LN-dropout"] = lambda r, d, n=name: _transformer_case(r, d, norm=n,
                                                                                              dropout=0.1)
        made[f"Transformer-{layer}-untied-pre-LN"] = lambda r, d, n=name: _transformer_case(
            r, d, norm=n, pre_norm=True, tie_embeddings=False)
    return made


def case_softmax(rng, dt):
    m = SoftmaxFunction()
    return Case(m, {"x": 2.0 * rng.standard_normal((B, HEADS, T, S))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": torch.softmax(i["x"], dim=-1)})


def case_dropout(rng, dt):
    m = Dropout(0.3, RandomState(7))
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.dropout(d, "", i["x"])}, record_dropout=True)


def _sdpa_case(rng, mask, tq, tk, d_k=4, d_v=3, p=0.0):
    m = ScaledDotProductAttention(dropout=p, rng=RandomState(3) if p else None)
    ins = {"q": rng.standard_normal((B, HEADS, tq, d_k)), "k": rng.standard_normal((B, HEADS, tk, d_k)),
           "v": rng.standard_normal((B, HEADS, tk, d_v))}
    return Case(m, ins, lambda m, i: {"out": m(i["q"], i["k"], i["v"], mask)},
                lambda m, g: dict(zip("qkv", m.backward(g["out"]))),
                lambda P, i, d: {"out": tm.attention(i["q"], i["k"], i["v"], _t(mask), d.get("dropout"))},
                record_dropout=bool(p))


def case_sdpa_padding(rng, dt):
    _, _, src_mask, _ = padded_batch(rng)
    return _sdpa_case(rng, src_mask, T, S)


def case_sdpa_causal(rng, dt):
    _, _, _, tgt_mask = padded_batch(rng)
    return _sdpa_case(rng, tgt_mask, T, T)


def case_sdpa_fully_masked_row(rng, dt):
    _, _, src_mask, _ = padded_batch(rng)
    mask = np.broadcast_to(src_mask, (B, 1, T, S)).copy()
    mask[1, 0, 2, :] = False  # one query row sees no key at all: uniform weights, not NaN
    return _sdpa_case(rng, mask, T, S)


def case_sdpa_dropout(rng, dt):
    _, _, src_mask, _ = padded_batch(rng)
    return _sdpa_case(rng, src_mask, T, S, d_k=4, d_v=4, p=0.2)


def case_mha_self_padding(rng, dt):
    _, _, src_mask, _ = padded_batch(rng)
    m = MultiHeadAttention(D, HEADS, rng=rng, dtype=dt)
    _randomize(m, rng)
    kw = dict(heads=HEADS, d_k=D // HEADS, d_v=D // HEADS)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"], mask=src_mask)}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.multi_head(P, "", i["x"], mask=_t(src_mask), **kw)})


def case_mha_self_causal(rng, dt):
    _, _, _, tgt_mask = padded_batch(rng)
    m = MultiHeadAttention(D, HEADS, rng=rng, dtype=dt)
    _randomize(m, rng)
    kw = dict(heads=HEADS, d_k=D // HEADS, d_v=D // HEADS)
    return Case(m, {"y": rng.standard_normal((B, T, D))},
                lambda m, i: {"out": m(i["y"], mask=tgt_mask)}, lambda m, g: {"y": m.backward(g["out"])},
                lambda P, i, d: {"out": tm.multi_head(P, "", i["y"], mask=_t(tgt_mask), **kw)})


def case_mha_cross(rng, dt):
    _, _, src_mask, _ = padded_batch(rng)
    m = MultiHeadAttention(D, HEADS, d_k=3, d_v=5, rng=rng, dtype=dt)
    _randomize(m, rng)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    return Case(m, ins, lambda m, i: {"out": m(i["y"], i["memory"], mask=src_mask)},
                lambda m, g: dict(zip(("y", "memory"), m.backward(g["out"]))),
                lambda P, i, d: {"out": tm.multi_head(P, "", i["y"], i["memory"], mask=_t(src_mask),
                                                      heads=HEADS, d_k=3, d_v=5)})


def case_feedforward(rng, dt, activation="relu"):
    m = FeedForward(D, DFF, rng=rng, dtype=dt, activation=activation)
    _randomize(m, rng, 0.1)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.feed_forward(P, "", i["x"], kind=activation)})


def _residual_case(rng, dt, pre):
    m = Holder(res=Residual(D, dropout=0.1, pre_norm=pre, rng=RandomState(5), dtype=dt),
                ffn=FeedForward(D, DFF, rng=rng, dtype=dt))
    _randomize(m, rng, 0.3)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m.res(i["x"], m.ffn)}, lambda m, g: {"x": m.res.backward(g["y"], m.ffn)},
                lambda P, i, d: {"y": tm.residual(P, "res", i["x"], lambda h: tm.feed_forward(P, "ffn", h, d),
                                                  pre_norm=pre, eps=1e-5, replay=d)},
                record_dropout=True)


def case_residual_post_ln(rng, dt):
    return _residual_case(rng, dt, False)


def case_residual_pre_ln(rng, dt):
    return _residual_case(rng, dt, True)


def _layer_cfg(pre):
    return small_config(pre_norm=pre, dropout=0.1, attn_dropout=0.1, relu_dropout=0.1, ln_eps=1e-6)


def _encoder_layer_case(rng, dt, pre):
    _, _, src_mask, _ = padded_batch(rng)
    cfg = _layer_cfg(pre)
    m = EncoderLayer(cfg, rng, RandomState(11), dt)
    _randomize(m, rng, 0.3)
    arch = tm.Arch.from_config(cfg)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"y": m(i["x"], src_mask)}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.encoder_layer(P, "", i["x"], _t(src_mask), arch, d)},
                record_dropout=True)


def _decoder_layer_case(rng, dt, pre):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    cfg = _layer_cfg(pre)
    m = DecoderLayer(cfg, rng, RandomState(12), dt)
    _randomize(m, rng, 0.3)
    arch = tm.Arch.from_config(cfg)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    return Case(m, ins, lambda m, i: {"out": m(i["y"], i["memory"], tgt_mask, src_mask)},
                lambda m, g: dict(zip(("y", "memory"), m.backward(g["out"]))),
                lambda P, i, d: {"out": tm.decoder_layer(P, "", i["y"], i["memory"], _t(tgt_mask), _t(src_mask),
                                                         arch, d)},
                record_dropout=True)


def _encoder_case(rng, dt, pre):
    _, _, src_mask, _ = padded_batch(rng)
    cfg = small_config(pre_norm=pre)
    m = Encoder(cfg, rng, None, dt)
    _randomize(m, rng, 0.3)
    arch = tm.Arch.from_config(cfg)
    return Case(m, {"x": rng.standard_normal((B, S, D))},
                lambda m, i: {"memory": m(i["x"], src_mask)}, lambda m, g: {"x": m.backward(g["memory"])},
                lambda P, i, d: {"memory": tm.encoder(P, "", i["x"], _t(src_mask), arch)})


def _decoder_case(rng, dt, pre):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    cfg = small_config(pre_norm=pre)
    m = Decoder(cfg, rng, None, dt)
    _randomize(m, rng, 0.3)
    arch = tm.Arch.from_config(cfg)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    return Case(m, ins, lambda m, i: {"h": m(i["y"], i["memory"], tgt_mask, src_mask)},
                lambda m, g: dict(zip(("y", "memory"), m.backward(g["h"]))),
                lambda P, i, d: {"h": tm.decoder(P, "", i["y"], i["memory"], _t(tgt_mask), _t(src_mask), arch)})


def _loss_case(rng, dt, eps):
    tgt = padded_ids(rng, B, T, [T, 3, 1])
    m = _LossHolder(eps)
    return Case(m, {"logits": 2.0 * rng.standard_normal((B, T, V))},
                lambda m, i: {"loss": m.crit.forward(i["logits"], tgt)},
                lambda m, g: {"logits": m.crit.backward() * g["loss"]},
                lambda P, i, d: {"loss": tm.label_smoothed_loss(i["logits"], _t(tgt), eps, PAD)})


def _model_case(cfg, m, src, tgt, record_dropout, start=None):
    """A whole-Transformer case: logits and loss of (src, tgt) against the mirror, every gradient. ``start``: the
    decoder input is ``start`` then tgt[:, :-1] and the loss predicts all of tgt (Marian's start from pad);
    otherwise tgt[:, 0] is the start (BOS)."""
    if start is None:
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    else:
        tgt_in, tgt_out = np.concatenate([np.full((tgt.shape[0], 1), start), tgt[:, :-1]], axis=1), tgt
    arch = tm.Arch.from_config(cfg)
    pad = cfg.pad_id
    crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, pad)

    def nf_forward(m, i):
        logits = m(src, tgt_in)
        return {"logits": logits, "loss": crit.forward(logits, tgt_out)}

    def nf_backward(m, g):
        m.backward(crit.backward() * g["loss"])
        return {}

    def torch_forward(P, i, d):
        logits = tm.transformer(P, _t(src), _t(tgt_in), arch, d)
        return {"logits": logits, "loss": tm.label_smoothed_loss(logits, _t(tgt_out), cfg.label_smoothing, pad)}

    return Case(m, {}, nf_forward, nf_backward, torch_forward, seeded=("loss",), record_dropout=record_dropout,
                criterion=crit)


def _marian_case(rng, dt, **kw):
    """What a Marian (opus-mt) model computes: SiLU, a frozen non-zero logits bias, the pad row's gradient rule,
    pad V - 1, and a decoder input that starts with pad; a source row all padding (fully masked rows)."""
    src, tgt, _, _ = padded_batch(rng)
    cfg = small_config(activation="silu", logits_bias=True, pad_row_gradient=False, pad_id=MARIAN_PAD, **kw)
    m = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=dt)
    _randomize(m, rng, 0.2)
    m.final_logits_bias[...] = rng.standard_normal(V)
    return _model_case(cfg, m, as_marian_ids(src), as_marian_ids(tgt), cfg.dropout > 0, start=MARIAN_PAD)


def _transformer_case(rng, dt, **kw):
    src, tgt, _, _ = padded_batch(rng)
    cfg = small_config(**kw)
    m = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=dt)
    _randomize(m, rng, 0.2)
    return _model_case(cfg, m, src, tgt, cfg.dropout > 0 or cfg.attn_dropout > 0 or cfg.relu_dropout > 0)


CASES = {
    "Linear": case_linear,
    "Embedding-repeated-ids": case_embedding,
    "Embedding-pad-row-rule": case_embedding_pad_row,
    **{ACTIVATIONS[n].layer: lambda r, d, n=n: case_activation(r, d, n) for n in SMOOTH},
    **{f"FeedForward-{ACTIVATIONS[n].layer}": lambda r, d, n=n: case_feedforward(r, d, n) for n in SMOOTH},
    "OutputProjection": case_output_projection,
    "PositionalEncoding-offset3": case_positional,
    "PositionalEncoding-odd-width": case_positional_odd_width,
    "LearnedPositions-offset3": case_learned_positions,
    "LearnedPositions-one-table-two-uses": case_learned_positions_shared,
    "ReLU": case_relu,
    "LayerNorm": case_layernorm,
    "Softmax": case_softmax,
    "Dropout-replayed-mask": case_dropout,
    "SDPA-padding-Tq!=Tk": case_sdpa_padding,
    "SDPA-causal+padding": case_sdpa_causal,
    "SDPA-fully-masked-row": case_sdpa_fully_masked_row,
    "SDPA-attn-dropout": case_sdpa_dropout,
    "MHA-self-padding": case_mha_self_padding,
    "MHA-self-causal": case_mha_self_causal,
    "MHA-cross-dk3-dv5": case_mha_cross,
    "FeedForward": case_feedforward,
    "Residual-post-LN": case_residual_post_ln,
    "Residual-pre-LN": case_residual_pre_ln,
    "EncoderLayer-post-LN-dropout": lambda r, d: _encoder_layer_case(r, d, False),
    "EncoderLayer-pre-LN-dropout": lambda r, d: _encoder_layer_case(r, d, True),
    "DecoderLayer-post-LN-dropout": lambda r, d: _decoder_layer_case(r, d, False),
    "DecoderLayer-pre-LN-dropout": lambda r, d: _decoder_layer_case(r, d, True),
    "Encoder-post-LN": lambda r, d: _encoder_case(r, d, False),
    "Encoder-pre-LN": lambda r, d: _encoder_case(r, d, True),
    "Decoder-post-LN": lambda r, d: _decoder_case(r, d, False),
    "Decoder-pre-LN": lambda r, d: _decoder_case(r, d, True),
    "Loss-eps0.1": lambda r, d: _loss_case(r, d, 0.1),
    "Loss-eps0": lambda r, d: _loss_case(r, d, 0.0),
    "Transformer-tied-post-LN": lambda r, d: _transformer_case(r, d),
    "Transformer-untied-pre-LN": lambda r, d: _transformer_case(r, d, tie_embeddings=False, pre_norm=True,
                                                                d_k=3, d_v=5, decoder_layers=3),
    "Transformer-tied-post-LN-dropout": lambda r, d: _transformer_case(r, d, dropout=0.1, attn_dropout=0.1,
                                                                       relu_dropout=0.1),
    "Transformer-learned-positions-dropout": lambda r, d: _transformer_case(r, d, positional="learned", dropout=0.1),
    "Transformer-learned-positions-untied-pre-LN": lambda r, d: _transformer_case(
        r, d, positional="learned", tie_embeddings=False, pre_norm=True),
    "Transformer-Marian-start-from-pad-dropout": lambda r, d: _marian_case(r, d, dropout=0.1),
    **norm_cases(),
}


@pytest.mark.parametrize("kernels", ["fast", "plain"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case_id", list(CASES))
def test_parity(case_id, dtype, kernels):
    """numformer (its fast kernels, or the plain math) against the PyTorch mirror."""
    with kernel_mode(kernels):
        run_parity(CASES[case_id], case_id, dtype)


def run_parity(build, case_id: str, dtype: str, record: bool = True) -> None:
    """Build the case, run numformer and the mirror, assert every tensor within TOL[dtype].

    ``record``: count the errors in the run's measured worst (not for a planted bug)."""
    dt = DTYPES[dtype]
    rng = np.random.default_rng(zlib.crc32(case_id.encode()))  # same data for both dtypes
    case = build(rng, dt)
    m = case.module
    m.train()
    m.zero_grad()
    for name, p in m.named_parameters():
        assert p.data.dtype == dt, f"{name} is {p.data.dtype}, expected {dtype}"
    inputs = {k: np.asarray(v, dtype=dt) for k, v in case.inputs.items()}
    P = mirror_params(m)  # before any forward: the weights numformer uses, upcast to float64

    # numformer forward + backward from random upstream gradients.
    saved = {k: v.copy() for k, v in inputs.items()}
    out = case.nf_forward(m, inputs)
    seeded = case.seeded or tuple(out)
    dys = {k: np.asarray(rng.standard_normal(np.shape(out[k])), dtype=dt) for k in seeded}
    dys_saved = {k: v.copy() for k, v in dys.items()}
    # float32 against float64: numformer's ReLU branches are replayed (see the module docstring)
    replay = recorded_decisions(m, dropout=case.record_dropout, relu=dt == np.float32)
    if case.record_dropout:
        assert any(isinstance(mod, Dropout) and n in replay for n, mod in m.named_modules()), \
            "a dropout case recorded no mask"
    out = {k: np.array(v) for k, v in out.items()}  # snapshot before backward can reuse buffers
    in_grads = case.nf_backward(m, dys)
    for k in saved:
        np.testing.assert_array_equal(inputs[k], saved[k], err_msg=f"numformer modified input {k} in place")
    for k in dys:
        np.testing.assert_array_equal(dys[k], dys_saved[k], err_msg=f"numformer modified upstream grad {k}")
    assert set(in_grads) == set(inputs), f"input gradients {sorted(in_grads)} != inputs {sorted(inputs)}"

    # The mirror: float64 autograd from the same upstream gradients.
    tin = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in inputs.items()}
    tout = case.torch_forward(P, tin, replay)
    assert set(tout) == set(out)
    total = sum((tout[k] * _t(dys[k].astype(np.float64))).sum() for k in seeded)
    total.backward()
    t_grads = P.grads()
    unused = [n for n, t in P.tensors.items() if t.grad is None]
    assert not unused, f"the mirror did not use {unused}"

    tol, zero_atol = TOL[dtype], ZERO_ATOL[dtype]
    errors, bad = {}, []
    for k in out:
        assert out[k].dtype == dt, f"output {k} is {out[k].dtype}"
        errors[f"output {k}"] = rel(out[k], tout[k].detach().numpy())
    for k in inputs:
        assert in_grads[k].dtype == dt and in_grads[k].shape == inputs[k].shape
        errors[f"d {k}"] = rel(in_grads[k], tin[k].grad.numpy())
    for name, p in m.named_parameters():
        assert p.grad.dtype == dt
        if name.endswith(ZERO_GRAD_SUFFIXES):
            na, nb = float(np.linalg.norm(p.grad)), float(np.linalg.norm(t_grads[name]))
            bound = zero_atol * max(1.0, float(np.linalg.norm(t_grads[name[: -len("bias")] + "weight"])))
            if max(na, nb) > bound:
                bad.append(f"d {name}: expected ~0, norms numformer {na:.3g} torch {nb:.3g} > {bound:.3g}")
            continue
        errors[f"d {name}"] = rel(p.grad, t_grads[name])
    for where, e in errors.items():
        if record:
            record_worst(f"parity-{dtype}", e, f"{case_id}: {where}")
        if not e <= tol:  # also catches NaN
            bad.append(f"{where}: rel {e:.3g} > {tol}")
    assert not bad, f"{case_id} [{dtype}] disagrees with PyTorch:\n  " + "\n  ".join(bad)


# -- gradient clipping and Adam + warmup ---------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("max_norm", [0.3, 1e3])  # clips / does not clip
def test_clip_grad_norm_matches_torch(max_norm, dtype):
    dt = DTYPES[dtype]
    rng = np.random.default_rng(17)
    m = Holder(a=Linear(5, 4, rng=rng, dtype=dt), b=LayerNorm(6, dtype=dt))
    params = m.parameters()
    for p in params:
        p.grad[...] = rng.standard_normal(p.shape)
    leaves = [torch.tensor(p.grad.astype(np.float64), requires_grad=True) for p in params]
    for t in leaves:
        t.grad = t.detach().clone()
    total = clip_grad_norm(params, max_norm)
    t_total = torch.nn.utils.clip_grad_norm_(leaves, max_norm)
    assert rel(total, t_total.numpy()) <= TOL[dtype]
    assert (float(t_total) > max_norm) == (max_norm == 0.3)
    for p, t in zip(params, leaves):
        assert p.grad.dtype == dt
        assert rel(p.grad, t.grad.numpy()) <= TOL[dtype]


def _noam_lambda(d_model, warmup):
    """LambdaLR's factor for Eq. 3. LambdaLR calls it with 0 before the first step and with k after
    k scheduler steps, while Eq. 3 counts optimizer steps from 1: the k-th update uses step = k."""
    def factor(epoch):
        step = epoch + 1
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)
    return factor


@pytest.mark.parametrize("clip", [None, 0.5], ids=["no-clip", "clip0.5"])
def test_adam_noam_20_steps_matches_torch(clip):
    steps, warmup = 20, 5
    cfg = small_config(pre_norm=False, dropout=0.0, label_smoothing=0.1)
    model = Transformer(cfg, seed=5, dtype=np.float64)
    model.train()
    arch = tm.Arch.from_config(cfg)
    P = mirror_params(model)
    crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, PAD)
    opt = Adam(model.parameters(), schedule=NoamSchedule(cfg.d_model, warmup=warmup))
    t_opt = torch.optim.Adam(P.leaves(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    t_sched = torch.optim.lr_scheduler.LambdaLR(t_opt, _noam_lambda(cfg.d_model, warmup))
    rng = np.random.default_rng(2024)
    batches = [padded_batch(rng)[:2] for _ in range(4)]  # a fixed sequence of padded batches, cycled
    lrs, clipped = [], 0
    for step in range(steps):
        src, tgt = batches[step % len(batches)]
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]

        model.zero_grad()
        loss = crit.forward(model(src, tgt_in), tgt_out)
        model.backward(crit.backward())
        if clip is not None:
            norm = clip_grad_norm(model.parameters(), clip)
        lr = opt.step()

        t_opt.zero_grad()
        t_loss = tm.label_smoothed_loss(tm.transformer(P, _t(src), _t(tgt_in), arch), _t(tgt_out),
                                        cfg.label_smoothing, PAD)
        t_loss.backward()
        if clip is not None:
            t_norm = torch.nn.utils.clip_grad_norm_(P.leaves(), clip)
            assert rel(norm, t_norm.numpy()) <= 1e-9
            clipped += float(t_norm) > clip
        t_lr = t_opt.param_groups[0]["lr"]
        t_opt.step()
        t_sched.step()

        assert rel(loss, t_loss.detach().numpy()) <= 1e-9, f"step {step + 1}: loss differs"
        assert math.isclose(lr, t_lr, rel_tol=1e-12), f"step {step + 1}: lr {lr} vs torch {t_lr}"
        lrs.append(lr)
    assert opt.step_count == steps
    # the schedule warmed up then decayed: peak at step == warmup
    assert int(np.argmax(lrs)) == warmup - 1
    if clip is not None:
        assert clipped > 0, "clipping never triggered: the test would not exercise it"

    t_values = P.values()
    bad = []
    for name, p in model.named_parameters():
        if name.endswith(ZERO_GRAD_SUFFIXES):
            # Their gradient is round-off noise (see ZERO_GRAD_SUFFIXES); Adam turns noise g ~ 1e-17
            # into steps of about lr * g / eps ~ 1e-9, so both stay near their start value (zero).
            assert np.linalg.norm(p.data) <= 1e-6 and np.linalg.norm(t_values[name]) <= 1e-6, name
            continue
        e = rel(p.data, t_values[name])
        record_worst("parity-adam20-float64", e, f"{'clip' if clip else 'no-clip'}: {name}")
        if not e <= 1e-9:
            bad.append(f"{name}: rel {e:.3g}")
    assert not bad, "parameters after 20 Adam steps differ from torch.optim.Adam:\n  " + "\n  ".join(bad)


# -- the mirror against torch's own composite blocks -------------------------------------

def test_mirror_matches_torch_builtins():
    """Guards the reference itself against a misconception shared with numformer: the mirror's
    attention, multi-head attention, sinusoids and smoothed loss against torch's ready-made
    versions or the paper's formulas written out element by element (float64)."""
    rng = np.random.default_rng(99)
    src, tgt, src_mask, tgt_mask = padded_batch(rng)
    f64 = torch.float64
    q, k, v = (torch.tensor(rng.standard_normal((B, HEADS, T, 4))),
               torch.tensor(rng.standard_normal((B, HEADS, S, 4))),
               torch.tensor(rng.standard_normal((B, HEADS, S, 3))))
    # Batch row 2 is all padding: torch's builtins return zeros (SDPA) or NaN (MultiheadAttention)
    # for a query that sees no key, numformer and the mirror a uniform average (the module
    # docstring of numformer.layers.attention says why); the builtins are compared on rows 0-1.
    seen = slice(0, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=_t(src_mask))
    assert rel(tm.attention(q, k, v, _t(src_mask))[seen].numpy(), ref[seen].numpy()) <= 1e-12

    # nn.MultiheadAttention (d_k = d_v = d_model / heads), self-attention with causal + padding mask.
    mha = torch.nn.MultiheadAttention(D, HEADS, batch_first=True, dtype=f64)
    W = mha.in_proj_weight.detach()
    bias = mha.in_proj_bias.detach().normal_()
    P = tm.MirrorParams([])
    P.tensors = {"w_q.weight": W[:D], "w_k.weight": W[D:2 * D], "w_v.weight": W[2 * D:],
                 "w_q.bias": bias[:D], "w_k.bias": bias[D:2 * D], "w_v.bias": bias[2 * D:],
                 "w_o.weight": mha.out_proj.weight.detach(), "w_o.bias": mha.out_proj.bias.detach()}
    x = torch.tensor(rng.standard_normal((B, T, D)))
    blocked = ~_t(np.broadcast_to(tgt_mask, (B, HEADS, T, T)).reshape(B * HEADS, T, T).copy())
    ref, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    got = tm.multi_head(P, "", x, mask=_t(tgt_mask), heads=HEADS, d_k=D // HEADS, d_v=D // HEADS)
    assert rel(got[seen].detach().numpy(), ref[seen].detach().numpy()) <= 1e-12

    # Section 3.5 written out entry by entry.
    table = tm.sinusoid_table(11, 6).numpy()
    for pos in range(11):
        for i in range(3):
            assert math.isclose(table[pos, 2 * i], math.sin(pos / 10000 ** (2 * i / 6)), abs_tol=1e-15)
            assert math.isclose(table[pos, 2 * i + 1], math.cos(pos / 10000 ** (2 * i / 6)), abs_tol=1e-15)

    # Smoothed target q = (1 - eps) onehot + eps / V over all V classes, mean over non-pad tokens.
    eps = 0.1
    logits = torch.tensor(rng.standard_normal((B, T, V)))
    target = _t(tgt)
    q_dist = torch.full((B, T, V), eps / V, dtype=f64)
    q_dist.scatter_add_(2, target[..., None], torch.full((B, T, 1), 1 - eps, dtype=f64))
    per_token = -(q_dist * torch.log_softmax(logits, -1)).sum(-1)
    keep = (target != PAD).to(f64)
    ref = (per_token * keep).sum() / keep.sum()
    assert rel(tm.label_smoothed_loss(logits, target, eps, PAD).numpy(), ref.numpy()) <= 1e-13


# -- the same comparisons at the sizes training runs ----------------------------------------
# The tiny shapes above stay under every threading threshold of numformer.kernels, so the
# threaded, blocked and fused paths that training runs would go unchecked there. These cases
# use the small preset's training shape (64 sentences of about 40 tokens, d_model 256, 4 heads,
# vocabulary 8,000) and base's layer shapes (d_model 512, 8 heads, d_ff 2048), with odd
# lengths, padding, a batch of one, and a source row that is all padding (fully masked rows).

SMALL = dict(batch=64, src=41, tgt=39, d=256, heads=4, d_ff=1024, vocab=8000)
BASE = dict(batch=8, src=35, tgt=29, d=512, heads=8, d_ff=2048)
EMPTY_ROW = 7  # the source row that is all padding in the real-size batches


def real_batch(rng, batch, src, tgt, vocab=V):
    """Source (batch, src) and target (batch, tgt + 1) ids with random lengths; source row
    EMPTY_ROW (if present) all padding under a target of real tokens."""
    s_len = rng.integers(src // 3, src + 1, batch)
    s_len[0] = src
    t_len = rng.integers(2, tgt + 2, batch)
    t_len[0] = tgt + 1
    if batch > EMPTY_ROW:
        s_len[EMPTY_ROW] = 0
    s_ids = rng.integers(1, vocab, (batch, src))
    t_ids = rng.integers(1, vocab, (batch, tgt + 1))
    s_ids[np.arange(src)[None, :] >= s_len[:, None]] = PAD
    t_ids[np.arange(tgt + 1)[None, :] >= t_len[:, None]] = PAD
    return s_ids, t_ids


def real_masks(src_ids, tgt_in):
    from numformer.model import causal_mask, padding_mask  # noqa: PLC0415
    return padding_mask(src_ids, PAD), causal_mask(tgt_in.shape[1]) & padding_mask(tgt_in, PAD)


def real_sdpa(rng, dt, causal):
    src, tgt = real_batch(rng, SMALL["batch"], SMALL["src"], SMALL["tgt"])
    src_mask, tgt_mask = real_masks(src, tgt[:, :-1])
    tq = SMALL["tgt"]
    tk = tq if causal else SMALL["src"]
    mask = tgt_mask if causal else src_mask
    d_k = SMALL["d"] // SMALL["heads"]
    m = ScaledDotProductAttention()
    shape = (SMALL["batch"], SMALL["heads"])
    ins = {"q": rng.standard_normal((*shape, tq, d_k)), "k": rng.standard_normal((*shape, tk, d_k)),
           "v": rng.standard_normal((*shape, tk, d_k))}
    return Case(m, ins, lambda m, i: {"out": m(i["q"], i["k"], i["v"], mask)},
                lambda m, g: dict(zip("qkv", m.backward(g["out"]))),
                lambda P, i, d: {"out": tm.attention(i["q"], i["k"], i["v"], _t(mask))})


def real_mha(rng, dt, cross, batch, tgt):
    src, tg = real_batch(rng, batch, BASE["src"], tgt)
    src_mask, tgt_mask = real_masks(src, tg[:, :-1])
    d, h = BASE["d"], BASE["heads"]
    m = MultiHeadAttention(d, h, rng=rng, dtype=dt)
    _randomize(m, rng, 0.1)
    kw = dict(heads=h, d_k=d // h, d_v=d // h)
    if cross:
        ins = {"y": rng.standard_normal((batch, tgt, d)), "memory": rng.standard_normal((batch, BASE["src"], d))}
        return Case(m, ins, lambda m, i: {"out": m(i["y"], i["memory"], mask=src_mask)},
                    lambda m, g: dict(zip(("y", "memory"), m.backward(g["out"]))),
                    lambda P, i, d_: {"out": tm.multi_head(P, "", i["y"], i["memory"], mask=_t(src_mask), **kw)})
    return Case(m, {"y": rng.standard_normal((batch, tgt, d))},
                lambda m, i: {"out": m(i["y"], mask=tgt_mask)}, lambda m, g: {"y": m.backward(g["out"])},
                lambda P, i, d_: {"out": tm.multi_head(P, "", i["y"], mask=_t(tgt_mask), **kw)})


def real_ffn(rng, dt):
    m = FeedForward(BASE["d"], BASE["d_ff"], rng=rng, dtype=dt)
    _randomize(m, rng, 0.1)
    return Case(m, {"x": rng.standard_normal((BASE["batch"], BASE["src"], BASE["d"]))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.feed_forward(P, "", i["x"])})


def real_activation(rng, dt, name):
    """A smooth activation (SiLU, GELU, ...) at a training shape: 16 sentences of 40 positions, d_ff 1024."""
    return case_activation(rng, dt, name, (16, 40, 1024), extremes=False)


def real_layernorm(rng, dt):
    d = BASE["d"]
    m = LayerNorm(d, eps=1e-5, dtype=dt)
    m.weight.data[:] = 1.0 + 0.3 * rng.standard_normal(d)
    m.bias.data[:] = 0.3 * rng.standard_normal(d)
    return Case(m, {"x": 3.0 * rng.standard_normal((BASE["batch"], BASE["src"], d)) + 1.0},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d_: {"y": tm.layer_norm(P, "", i["x"], 1e-5)})


def real_layer(rng, dt, decoder):
    src, tgt = real_batch(rng, BASE["batch"], BASE["src"], BASE["tgt"])
    src_mask, tgt_mask = real_masks(src, tgt[:, :-1])
    cfg = ModelConfig(vocab_size=V, d_model=BASE["d"], d_ff=BASE["d_ff"], heads=BASE["heads"], layers=1,
                      dropout=0.1, max_len=64, pad_id=PAD)
    arch = tm.Arch.from_config(cfg)
    b, d = BASE["batch"], BASE["d"]
    if not decoder:
        m = EncoderLayer(cfg, rng, RandomState(11), dt)
        _randomize(m, rng, 0.1)
        return Case(m, {"x": rng.standard_normal((b, BASE["src"], d))},
                    lambda m, i: {"y": m(i["x"], src_mask)}, lambda m, g: {"x": m.backward(g["y"])},
                    lambda P, i, dr: {"y": tm.encoder_layer(P, "", i["x"], _t(src_mask), arch, dr)},
                    record_dropout=True)
    m = DecoderLayer(cfg, rng, RandomState(12), dt)
    _randomize(m, rng, 0.1)
    ins = {"y": rng.standard_normal((b, BASE["tgt"], d)), "memory": rng.standard_normal((b, BASE["src"], d))}
    return Case(m, ins, lambda m, i: {"out": m(i["y"], i["memory"], tgt_mask, src_mask)},
                lambda m, g: dict(zip(("y", "memory"), m.backward(g["out"]))),
                lambda P, i, dr: {"out": tm.decoder_layer(P, "", i["y"], i["memory"], _t(tgt_mask), _t(src_mask),
                                                          arch, dr)},
                record_dropout=True)


def real_loss(rng, dt):
    _, tgt = real_batch(rng, SMALL["batch"], SMALL["src"], SMALL["tgt"], SMALL["vocab"])
    target = tgt[:, 1:]
    m = _LossHolder(0.1)
    return Case(m, {"logits": 2.0 * rng.standard_normal((*target.shape, SMALL["vocab"]))},
                lambda m, i: {"loss": m.crit.forward(i["logits"], target)},
                lambda m, g: {"logits": m.crit.backward() * g["loss"]},
                lambda P, i, d: {"loss": tm.label_smoothed_loss(i["logits"], _t(target), 0.1, PAD)})


def real_learned_positions(rng, dt):
    """The table at the small preset's training shape, rows from offset 0 (a batch's positions)."""
    m = LearnedPositionalEmbedding(SMALL["d"], 64, dtype=dt, rng=rng)
    return Case(m, {"x": rng.standard_normal((SMALL["batch"], SMALL["src"], SMALL["d"]))},
                lambda m, i: {"y": m(i["x"])}, lambda m, g: {"x": m.backward(g["y"])},
                lambda P, i, d: {"y": tm.learned_positional(P, "", i["x"])})


def real_transformer(rng, dt, **changes):
    """The small preset (3+3 layers, d_model 256, 4 heads, d_ff 1024, vocabulary 8,000, dropout 0.1)
    on a 64-sentence batch: logits, loss and every gradient; ``changes`` to the preset (learned positions)."""
    from numformer.presets import get_preset  # noqa: PLC0415
    cfg = get_preset("small", vocab_size=SMALL["vocab"], pad_id=PAD, max_len=64, **changes)
    src, tgt = real_batch(rng, SMALL["batch"], SMALL["src"], SMALL["tgt"], SMALL["vocab"])
    m = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=dt)
    _randomize(m, rng, 0.1)
    return _model_case(cfg, m, src, tgt, record_dropout=True)


REAL_CASES = {
    "SDPA-small-shape-padding-empty-row": lambda r, d: real_sdpa(r, d, causal=False),
    "SDPA-small-shape-causal": lambda r, d: real_sdpa(r, d, causal=True),
    "MHA-cross-base-shape": lambda r, d: real_mha(r, d, cross=True, batch=BASE["batch"], tgt=BASE["tgt"]),
    "MHA-self-base-shape-batch-of-one": lambda r, d: real_mha(r, d, cross=False, batch=1, tgt=57),
    "FeedForward-base-shape": real_ffn,
    **{f"{ACTIVATIONS[n].layer}-16x40x1024": lambda r, d, n=n: real_activation(r, d, n) for n in SMOOTH},
    "LayerNorm-base-shape": real_layernorm,
    "EncoderLayer-base-shape-dropout": lambda r, d: real_layer(r, d, decoder=False),
    "DecoderLayer-base-shape-dropout": lambda r, d: real_layer(r, d, decoder=True),
    "Loss-small-shape-vocab-8000": real_loss,
    "Transformer-small-preset-dropout": real_transformer,
    "LearnedPositions-small-shape": real_learned_positions,
    "Transformer-small-preset-learned-positions": lambda r, d: real_transformer(r, d, positional="learned"),
}


@pytest.mark.parametrize("kernels", ["fast", "plain"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case_id", list(REAL_CASES))
def test_parity_at_training_sizes(case_id, dtype, kernels):
    """As test_parity, at the small preset's training shape and base's layer shapes."""
    with kernel_mode(kernels):
        run_parity(REAL_CASES[case_id], case_id, dtype)


# -- replaying the ReLU branches cannot hide a wrong ReLU ------------------------------------

@pytest.mark.parametrize("case_id", ["FeedForward-base-shape", "Transformer-small-preset-dropout"])
def test_planted_relu_backward_without_its_active_set_fails_float32_parity(case_id, monkeypatch):
    """dx = dy (the active set forgotten) in numformer's ReLU: float32 parity fails at the first
    feed-forward weights, although the mirror replays numformer's active sets."""
    import numformer.layers.relu as relu_module  # noqa: PLC0415

    monkeypatch.setattr(relu_module, "relu_backward", lambda dy, positive: dy)
    with pytest.raises(AssertionError, match=r"ffn\.w_1\.weight|d w_1\.weight"):
        run_parity(REAL_CASES[case_id], case_id, "float32", record=False)


# At most this share of the ReLU pre-activations may fall on different sides of zero in float32 and
# float64; measured 1 of 15.7 million on the small preset's case (6.4e-8). The largest float32 error
# of a pre-activation there is 4.3e-6 of the layer's RMS, and a sign can only differ where the value
# is within that error of zero: with roughly normal pre-activations that is under 1e-5 of them even
# if every entry had the largest error.
MAX_FLIP_SHARE = 1e-5
# ... and every such entry lies within this fraction of the layer's RMS of zero in float64 (25 times
# the largest float32 error measured): a threshold misplaced by more than that is a wrong ReLU.
MAX_FLIP_DISTANCE = 1e-4


def relu_decisions(case_id: str, dtype: str) -> dict:
    """Every ReLU of one forward of a real-size case: name -> (its input as float64, the active set it chose)."""
    rng = np.random.default_rng(zlib.crc32(case_id.encode()))  # the same data in both dtypes, as run_parity
    case = REAL_CASES[case_id](rng, DTYPES[dtype])
    m = case.module
    m.train()
    seen = {}
    for name, mod in m.named_modules():
        if isinstance(mod, ReLU):
            def recording(x, name=name, mod=mod, forward=mod.forward):
                y = forward(x)
                seen[name] = (np.array(x, dtype=np.float64), np.array(mod.active_set, dtype=bool))
                return y
            mod.forward = recording  # this instance only
    case.nf_forward(m, {k: np.asarray(v, dtype=DTYPES[dtype]) for k, v in case.inputs.items()})
    return seen


def assert_relu_sets_agree_up_to_rounding(got32: dict, got64: dict) -> int:
    """Every ReLU's active set in float32 equals float64's except at entries within MAX_FLIP_DISTANCE
    of the layer's RMS from zero, at most MAX_FLIP_SHARE of all entries; returns the number of flips."""
    assert set(got32) == set(got64) and got64, "no ReLU ran"
    flips = total = 0
    for name, (x64, active64) in got64.items():
        differ = got32[name][1] != active64
        rms = float(np.sqrt(np.mean(x64 ** 2)))
        far = np.abs(x64[differ]) > MAX_FLIP_DISTANCE * rms
        assert not far.any(), (f"{name}: float32 and float64 take different ReLU branches at "
                               f"{int(far.sum())} entries up to {np.abs(x64[differ]).max() / rms:.2g} RMS from zero")
        flips += int(differ.sum())
        total += x64.size
    assert flips <= MAX_FLIP_SHARE * total, f"{flips} of {total} ReLU pre-activations change sign in float32"
    return flips


def test_float32_relu_active_sets_differ_from_float64_only_at_rounding_level():
    case_id = "Transformer-small-preset-dropout"
    flips = assert_relu_sets_agree_up_to_rounding(relu_decisions(case_id, "float32"),
                                                  relu_decisions(case_id, "float64"))
    print(f"\n{case_id}: {flips} ReLU pre-activations change sign between float32 and float64")


def test_a_misplaced_float32_relu_threshold_is_caught(monkeypatch):
    """A float32 ReLU active at x > 1e-3 instead of x > 0 flips a few thousand units: the check above fails."""
    import numformer.layers.relu as relu_module  # noqa: PLC0415

    case_id = "Transformer-small-preset-dropout"
    got64 = relu_decisions(case_id, "float64")
    right = relu_module.relu_forward

    def shifted(x):
        y, positive = right(x)
        return y, (x > 1e-3 if x.dtype == np.float32 else positive)

    monkeypatch.setattr(relu_module, "relu_forward", shifted)
    with pytest.raises(AssertionError, match="different ReLU branches"):
        assert_relu_sets_agree_up_to_rounding(relu_decisions(case_id, "float32"), got64)
