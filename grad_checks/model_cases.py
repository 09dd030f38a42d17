"""The gradient checks of layers built of layers, in float64: the encoder and decoder layers, the stacks, the
whole model plus loss, and Marian's (grad_checks/cases.py indexes them by layer name).

Each builder returns GradCases with padding in the batch, source and target of different lengths, a source
row that is all padding under a target row of real tokens (fully masked attention rows, whose scores must get
no gradient), four heads, and random inputs; dropout is either off or replayed with a fixed mask (the model's
RandomState is restored before every forward).

:func:`marian` checks what a Marian (opus-mt) model computes besides: the pad row's gradient rule
(``Embedding(padding_idx=...)``), alone and tied with the pre-softmax projection, and the whole model with
SiLU, a frozen logits bias, that rule and a decoder input starting with pad. :func:`norm_cases` builds the cases of
every norm of numformer's table but LayerNorm (numformer.norms), alone, in the residual sub-layer and in the whole
model, from its row alone.
"""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
from numformer.layers import FeedForward, OutputProjection, Residual
from numformer.layers.registry import replaced
from numformer.layers.sublayer import norm_layer
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Decoder, DecoderLayer, Encoder, EncoderLayer, Transformer
from numformer.module import lacks_forward_mode
from numformer.norms import NORMS

from .case_helpers import (B, D, F64, MARIAN_PAD, PAD, S, T, V, HeldPadEmbedding, Holder, _by_name, _replay,
                           as_marian_ids, checks, forward_mode, loss_forward_mode, padded_batch, padded_ids,
                           residual_forward_mode, small_config)


@checks("EncoderLayer", "DecoderLayer")
def encoder_decoder_layers(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for pre in (False, True):
        cfg = small_config(pre_norm=pre, dropout=0.1)
        tag = "pre-LN" if pre else "post-LN"
        rs = RandomState(11)
        m = EncoderLayer(cfg, rng, rs, F64)
        out.append(GradCase("EncoderLayer", f"{tag}, dropout fixed mask", m, {"x": rng.standard_normal((B, S, D))},
                            lambda m, i: m(i["x"], src_mask), lambda m, g: {"x": m.backward(g[0])},
                            before_forward=_replay(rs), **forward_mode("x")))
        rs = RandomState(12)
        m = DecoderLayer(cfg, rng, rs, F64)
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("DecoderLayer", f"{tag}, dropout fixed mask", m, ins,
                            lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                            lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))),
                            before_forward=_replay(rs), **forward_mode("y", "memory")))
    return out


@checks("Encoder", "Decoder")
def stacks(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for pre in (False, True):
        cfg = small_config(pre_norm=pre)
        tag = "2 layers " + ("pre-LN" if pre else "post-LN")
        m = Encoder(cfg, rng, None, F64)
        out.append(GradCase("Encoder", tag, m, {"x": rng.standard_normal((B, S, D))},
                            lambda m, i: m(i["x"], src_mask), lambda m, g: {"x": m.backward(g[0])},
                            **forward_mode("x")))
        m = Decoder(cfg, rng, None, F64)
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("Decoder", tag, m, ins, lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                            lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))), **forward_mode("y", "memory")))
    return out

@checks("Transformer")
def transformer(rng):
    src, tgt, _, _ = padded_batch(rng)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    out = []
    for name, kw in [("tied, post-LN, dropout 0.1 fixed mask, eps_ls 0.1", dict(dropout=0.1)),
                     ("untied, pre-LN, d_k 3", dict(tie_embeddings=False, pre_norm=True, d_k=3, d_v=4)),
                     ("tied, post-LN, attention + ReLU dropout", dict(dropout=0.1, attn_dropout=0.1, relu_dropout=0.1)),
                     ("tied, post-LN, learned positions (Table 3 row E), dropout 0.1 fixed mask",
                      dict(dropout=0.1, positional="learned"))]:
        model = Transformer(small_config(**kw), seed=int(rng.integers(1 << 30)), dtype=F64)
        crit = LabelSmoothedCrossEntropy(0.1, PAD)

        def fwd(m, i, crit=crit):
            return crit.forward(m(src, tgt_in), tgt_out) * 1.0

        def bwd(m, g, crit=crit):
            m.backward(crit.backward() * g[0])
            return {}

        out.append(GradCase("Transformer+loss", name, model, {}, fwd, bwd, before_forward=_replay(model.rng),
                            **loss_forward_mode(crit, model)))
    return out

@checks("Marian")
def marian(rng):
    """The pad row's gradient rule alone (repeated ids, pad at position 0 and at the end) and tied with the
    pre-softmax projection (the pad row's gradient then comes from the logits alone); the whole model + loss
    as a Marian model computes it: SiLU, a frozen non-zero logits bias, the rule, pad id V - 1, and a decoder
    input that starts with pad (the start position causal-only), a source row all padding, dropout replayed."""
    out = []
    ids = as_marian_ids(padded_ids(rng, B, S, [S, 4, 2]))
    ids[:, 0] = MARIAN_PAD  # a pad lookup that reaches the output of every row
    ids[0, 1:4] = 5
    m = HeldPadEmbedding(V, D, rng=rng, dtype=F64, padding_idx=MARIAN_PAD)
    out.append(GradCase("Embedding (Marian pad row)", "padding_idx V-1, repeated ids", m, {},
                        lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1], **forward_mode()))
    src = HeldPadEmbedding(V, D, rng=rng, dtype=F64, padding_idx=MARIAN_PAD)
    tied = Holder(src=src, tgt=HeldPadEmbedding(V, D, weight=src.weight, dtype=F64, padding_idx=MARIAN_PAD),
                  proj=OutputProjection(D, V, weight=src.weight, dtype=F64))
    tgt_ids = ids[:, :T]
    ins = {"h": rng.standard_normal((B, T, D))}
    out.append(GradCase("Embedding (Marian pad row)", "tied with the projection: the pad row's gradient from the "
                        "logits alone", tied, ins, lambda m, i: (m.src(ids), m.tgt(tgt_ids), m.proj(i["h"])),
                        lambda m, g: (m.tgt.backward(g[1]), m.src.backward(g[0]), {"h": m.proj.backward(g[2])})[2],
                        jvp=lambda m, t: (m.src.jvp(), m.tgt.jvp(), m.proj.jvp(t["h"])),
                        backward_jvp=lambda m, g, gd: (m.tgt.backward_jvp(g[1], gd[1]), m.src.backward_jvp(g[0], gd[0]),
                                                       _by_name(("h",), m.proj.backward_jvp(g[2], gd[2])))[2]))

    src_ids, tgt, _, _ = padded_batch(rng)
    src_ids, tgt = as_marian_ids(src_ids), as_marian_ids(tgt)
    tgt_out = tgt
    tgt_in = np.concatenate([np.full((B, 1), MARIAN_PAD), tgt[:, :-1]], axis=1)  # decoder_start_token_id = pad
    cfg = small_config(dropout=0.1, activation="silu", logits_bias=True, pad_row_gradient=False, pad_id=MARIAN_PAD)
    with replaced({"Embedding": HeldPadEmbedding}):  # both embeddings hold their pad row
        model = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=F64)
    model.final_logits_bias[...] = rng.standard_normal(V)
    crit = LabelSmoothedCrossEntropy(0.1, MARIAN_PAD)

    def fwd(m, i):
        return crit.forward(m(src_ids, tgt_in), tgt_out) * 1.0

    def bwd(m, g):
        m.backward(crit.backward() * g[0])
        return {}

    out.append(GradCase("Transformer+loss (Marian)", "SiLU, logits bias, pad row rule, pad V-1, start from pad, "
                        "dropout 0.1 fixed mask", model, {}, fwd, bwd, before_forward=_replay(model.rng),
                        **loss_forward_mode(crit, model)))
    return out


def norm_cases(name: str):
    """The builder of the norm ``name``'s cases (a row of numformer.norms.NORMS other than LayerNorm, which has its
    own builder): the norm alone with random parameters, the residual sub-layer built with it around the
    feed-forward network, post- and pre-LN, dropout replayed, and the whole pre-LN model + loss, whose residuals
    and final norms are all this norm."""
    row = NORMS[name]

    def build(rng):
        m = norm_layer(name, D, dtype=F64)
        for p in m.parameters():
            p.data[:] = rng.standard_normal(p.shape)
        # forward mode where the norm has it (a norm without trains and is checked in reverse mode; the exact
        # Hessian-vector products refuse it in one line)
        modes = {} if lacks_forward_mode(m) else forward_mode("x")
        whole = {} if lacks_forward_mode(m) else loss_forward_mode
        out = [GradCase(row.layer, "random parameters", m, {"x": 3.0 * rng.standard_normal((B, S, D)) + 1.0},
                        lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, **modes)]
        for pre in (False, True):
            rs = RandomState(5)
            cfg = small_config(dropout=0.1, pre_norm=pre, norm=name)
            hold = Holder(res=Residual.from_config(cfg, rs, F64), ffn=FeedForward.from_config(cfg, rng, None, F64))
            out.append(GradCase("Residual", f"{'pre' if pre else 'post'}-LN with {row.layer} around FFN, dropout 0.1 "
                                "fixed mask", hold, {"x": rng.standard_normal((B, S, D))},
                                lambda m, i: m.res(i["x"], m.ffn), lambda m, g: {"x": m.res.backward(g[0], m.ffn)},
                                before_forward=_replay(rs), **(residual_forward_mode() if modes else {})))
        src, tgt, _, _ = padded_batch(rng)
        model = Transformer(small_config(pre_norm=True, dropout=0.1, norm=name), seed=int(rng.integers(1 << 30)),
                            dtype=F64)
        crit = LabelSmoothedCrossEntropy(0.1, PAD)

        def fwd(m, i):
            return crit.forward(m(src, tgt[:, :-1]), tgt[:, 1:]) * 1.0

        def bwd(m, g):
            m.backward(crit.backward() * g[0])
            return {}

        out.append(GradCase("Transformer+loss", f"pre-LN with {row.layer}, dropout 0.1 fixed mask", model, {}, fwd,
                            bwd, before_forward=_replay(model.rng), **(whole(crit, model) if whole else {})))
        return out

    build.__name__ = build.__qualname__ = name
    return build
