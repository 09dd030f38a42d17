"""The gradient checks: every layer of numformer and the whole model plus loss, in float64.

Each builder returns GradCases with padding in the batch, source and target of
different lengths, a source row that is all padding under a target row of real
tokens (fully masked attention rows, whose scores must get no gradient),
four heads, and random inputs; dropout is either off or replayed with a fixed mask
(the model's RandomState is restored before every forward).

The last two builders check what a Marian (opus-mt) model computes besides: SiLU, alone and in the
feed-forward network, and ``Marian``: the pad row's gradient rule (``Embedding(padding_idx=...)``), alone and
tied with the pre-softmax projection, and the whole model with SiLU, a frozen logits bias, that rule and a
decoder input starting with pad. They come last so that every earlier case keeps its seed and probes.
"""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.layers import (Dropout, Embedding, FeedForward, LayerNorm, LearnedPositionalEmbedding, Linear,
                              MultiHeadAttention, OutputProjection, PositionalEncoding, ReLU, Residual,
                              ScaledDotProductAttention, SiLU)
from numformer.layers.softmax import softmax as softmax_fn, softmax_backward
from numformer.finite_differences import GradCase
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Decoder, DecoderLayer, Encoder, EncoderLayer, Transformer, causal_mask, padding_mask
from numformer.module import Module
from numformer.presets import ModelConfig

F64 = np.float64
B, S, T, D, HEADS, DFF, V = 3, 6, 5, 8, 4, 16, 13
PAD = 0


def padded_ids(rng, batch, length, lengths):
    """(batch, length) ids in 1..V-1, right-padded with PAD to the given per-row lengths."""
    ids = rng.integers(1, V, size=(batch, length))
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
    return ids


def padded_batch(rng):
    """Source (B, S) and target (B, T) ids with padding, and the model's masks for them.

    Source row 2 is all padding: every key of it is masked, so its self-attention rows and
    the cross-attention rows of target row 2 (which has real tokens, so the loss sees them)
    are fully masked.
    """
    src = padded_ids(rng, B, S, [S, 4, 0])
    tgt = padded_ids(rng, B, T, [T, 3, 4])
    return src, tgt, padding_mask(src, PAD), causal_mask(T) & padding_mask(tgt, PAD)


def small_config(**kw) -> ModelConfig:
    """A 2-layer model config of the checks' dimensions, dropout off unless asked."""
    base = dict(vocab_size=V, d_model=D, d_ff=DFF, heads=HEADS, layers=2, dropout=0.0, max_len=32, pad_id=PAD)
    base.update(kw)
    return ModelConfig(**base)


class Holder(Module):
    """Groups modules so one check sees all their parameters (e.g. a Residual and its sub-layer)."""

    def __init__(self, **children):
        super().__init__()
        for k, v in children.items():
            setattr(self, k, v)


def _replay(rs: RandomState):
    """A before_forward hook that restores ``rs`` so every forward draws the same dropout masks."""
    state = rs.get_state()
    return lambda: rs.set_state(state)


def linear(rng):
    m = Linear(7, 5, rng=rng, dtype=F64)
    m.bias.data[:] = rng.standard_normal(5)
    x = rng.standard_normal((B, 4, 7))
    return [GradCase("Linear", "3-d input", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def embedding(rng):
    m = Embedding(V, D, rng=rng, dtype=F64)
    ids = padded_ids(rng, B, S, [S, 4, 2])
    ids[0, :3] = 5  # a repeated id: the scatter-add must sum its rows
    return [GradCase("Embedding", "repeated ids + padding", m, {},
                     lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1])]


def projection(rng):
    m = OutputProjection(D, V, rng=rng, dtype=F64)
    h = rng.standard_normal((B, T, D))
    return [GradCase("OutputProjection", "logits", m, {"h": h},
                     lambda m, i: m(i["h"]), lambda m, g: {"h": m.backward(g[0])})]


def positional(rng):
    m = PositionalEncoding(D, 32, dtype=F64)
    x = rng.standard_normal((B, S, D))
    return [GradCase("PositionalEncoding", "offset 3", m, {"x": x},
                     lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])})]


def learned_positions(rng):
    """The table alone at offset 3 (decoding's rows), and one table shared by a source and a target layer of
    different lengths (its gradient must collect both uses: added, never assigned)."""
    m = LearnedPositionalEmbedding(D, 32, dtype=F64, rng=rng)
    one = GradCase("LearnedPositionalEmbedding", "offset 3", m, {"x": rng.standard_normal((B, S, D))},
                   lambda m, i: m(i["x"], offset=3), lambda m, g: {"x": m.backward(g[0])})
    src = LearnedPositionalEmbedding(D, 32, dtype=F64, rng=rng)
    tied = Holder(src=src, tgt=LearnedPositionalEmbedding(D, 32, dtype=F64, weight=src.weight))
    ins = {"x": rng.standard_normal((B, S, D)), "y": rng.standard_normal((B, T, D))}
    two = GradCase("LearnedPositionalEmbedding", "one table, two uses (S 6, T 5 at offset 1)", tied, ins,
                   lambda m, i: (m.src(i["x"]), m.tgt(i["y"], offset=1)),
                   lambda m, g: {"y": m.tgt.backward(g[1]), "x": m.src.backward(g[0])})
    return [one, two]


def dropout(rng):
    rs = RandomState(7)
    m = Dropout(0.3, rs)
    x = rng.standard_normal((B, S, D))
    return [GradCase("Dropout", "p=0.3 fixed mask", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, before_forward=_replay(rs))]


def relu(rng):
    m = ReLU()
    x = rng.standard_normal((B, S, D))
    x[np.abs(x) < 1e-3] = 0.5  # keep entries away from the kink, where the derivative is undefined
    return [GradCase("ReLU", "random", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def layernorm(rng):
    m = LayerNorm(D, dtype=F64)
    m.weight.data[:] = rng.standard_normal(D)
    m.bias.data[:] = rng.standard_normal(D)
    x = 3.0 * rng.standard_normal((B, S, D)) + 1.0
    return [GradCase("LayerNorm", "random gain/bias", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


class SoftmaxFunction(Module):
    """Presents the functions softmax / softmax_backward (what attention runs) to the checker."""

    def forward(self, x):
        y = softmax_fn(x)
        self.save_for_backward(y=y)
        return y

    def backward(self, dy):
        return softmax_backward(dy, self.pop_saved("y"))


def softmax(rng):
    m = SoftmaxFunction()
    x = 2.0 * rng.standard_normal((B, HEADS, T, S))
    return [GradCase("Softmax", "last axis", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def scaled_dot_product(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for name, tq, tk, mask in [("padding mask, Tq != Tk", T, S, src_mask), ("causal + padding", T, T, tgt_mask)]:
        m = ScaledDotProductAttention()
        ins = {"q": rng.standard_normal((B, HEADS, tq, 4)), "k": rng.standard_normal((B, HEADS, tk, 4)),
               "v": rng.standard_normal((B, HEADS, tk, 3))}
        out.append(GradCase("ScaledDotProductAttention", name, m, ins,
                            lambda m, i, mask=mask: m(i["q"], i["k"], i["v"], mask),
                            lambda m, g: dict(zip("qkv", m.backward(g[0])))))
    rs = RandomState(3)
    m = ScaledDotProductAttention(dropout=0.2, rng=rs)
    ins = {"q": rng.standard_normal((B, HEADS, T, 4)), "k": rng.standard_normal((B, HEADS, S, 4)),
           "v": rng.standard_normal((B, HEADS, S, 4))}
    out.append(GradCase("ScaledDotProductAttention", "attention dropout 0.2 fixed mask", m, ins,
                        lambda m, i: m(i["q"], i["k"], i["v"], src_mask),
                        lambda m, g: dict(zip("qkv", m.backward(g[0]))), before_forward=_replay(rs)))
    return out


def multi_head(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    m = MultiHeadAttention(D, HEADS, rng=rng, dtype=F64)
    x = rng.standard_normal((B, S, D))
    out.append(GradCase("MultiHeadAttention", "self, padding mask", m, {"x": x},
                        lambda m, i: m(i["x"], mask=src_mask), lambda m, g: {"x": m.backward(g[0])}))
    m = MultiHeadAttention(D, HEADS, rng=rng, dtype=F64)
    y = rng.standard_normal((B, T, D))
    out.append(GradCase("MultiHeadAttention", "self, causal + padding", m, {"y": y},
                        lambda m, i: m(i["y"], mask=tgt_mask), lambda m, g: {"y": m.backward(g[0])}))
    m = MultiHeadAttention(D, HEADS, d_k=3, d_v=5, rng=rng, dtype=F64)
    ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
    out.append(GradCase("MultiHeadAttention", "encoder-decoder, d_k 3 d_v 5", m, ins,
                        lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                        lambda m, g: dict(zip(("y", "memory"), m.backward(g[0])))))
    return out


def feedforward(rng):
    m = FeedForward(D, DFF, rng=rng, dtype=F64)
    for lin in (m.w_1, m.w_2):
        lin.bias.data[:] = 0.1 * rng.standard_normal(lin.bias.shape)
    x = rng.standard_normal((B, S, D))
    return [GradCase("FeedForward", "d_ff 16", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def residual(rng):
    out = []
    for pre in (False, True):
        rs = RandomState(5)
        hold = Holder(res=Residual(D, dropout=0.1, pre_norm=pre, rng=rs, dtype=F64),
                       ffn=FeedForward(D, DFF, rng=rng, dtype=F64))
        x = rng.standard_normal((B, S, D))
        out.append(GradCase("Residual", ("pre-LN" if pre else "post-LN") + " around FFN, dropout 0.1 fixed mask",
                            hold, {"x": x}, lambda m, i: m.res(i["x"], m.ffn),
                            lambda m, g: {"x": m.res.backward(g[0], m.ffn)}, before_forward=_replay(rs)))
    return out


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
                            before_forward=_replay(rs)))
        rs = RandomState(12)
        m = DecoderLayer(cfg, rng, rs, F64)
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("DecoderLayer", f"{tag}, dropout fixed mask", m, ins,
                            lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                            lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))),
                            before_forward=_replay(rs)))
    return out


def stacks(rng):
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for pre in (False, True):
        cfg = small_config(pre_norm=pre)
        tag = "2 layers " + ("pre-LN" if pre else "post-LN")
        m = Encoder(cfg, rng, None, F64)
        out.append(GradCase("Encoder", tag, m, {"x": rng.standard_normal((B, S, D))},
                            lambda m, i: m(i["x"], src_mask), lambda m, g: {"x": m.backward(g[0])}))
        m = Decoder(cfg, rng, None, F64)
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("Decoder", tag, m, ins, lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                            lambda m, g: dict(zip(("y", "memory"), m.backward(g[0])))))
    return out


class _LossModule(Module):
    """Presents the loss (not a Module: it has no parameters) to the checker."""

    def __init__(self, smoothing):
        super().__init__()
        self.loss = LabelSmoothedCrossEntropy(smoothing, PAD)


def loss(rng):
    tgt = padded_ids(rng, B, T, [T, 3, 1])
    m = _LossModule(0.1)
    logits = 2.0 * rng.standard_normal((B, T, V))
    return [GradCase("LabelSmoothedCrossEntropy", "eps 0.1, padding", m, {"logits": logits},
                     lambda m, i: m.loss.forward(i["logits"], tgt) * 1.0,
                     lambda m, g: {"logits": m.loss.backward() * g[0]})]


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

        out.append(GradCase("Transformer+loss", name, model, {}, fwd, bwd, before_forward=_replay(model.rng)))
    return out


def silu(rng):
    """SiLU alone (no kink: nothing is kept away from 0; |x| up to 30, where the sigmoid saturates), and the
    feed-forward network with it (Marian's swish)."""
    m = SiLU()
    x = 3.0 * rng.standard_normal((B, S, D))
    x[0, 0, :5] = [-30.0, -8.0, 0.0, 8.0, 30.0]
    f = FeedForward(D, DFF, rng=rng, dtype=F64, activation="silu")
    for lin in (f.w_1, f.w_2):
        lin.bias.data[:] = 0.1 * rng.standard_normal(lin.bias.shape)
    return [GradCase("SiLU", "random, |x| up to 30", m, {"x": x},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}),
            GradCase("FeedForward", "d_ff 16, SiLU", f, {"x": rng.standard_normal((B, S, D))},
                     lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})]


def hold_pad_lookups(embedding) -> None:
    """Make the lookups of ``embedding.padding_idx`` read that row as it is now, whatever a probe does to the
    weight (an instance attribute; the layer's own backward runs unchanged).

    The pad row's gradient rule (no gradient from its lookups) is the gradient of a forward whose pad lookups
    read a constant; where such a lookup reaches the loss (a decoder input starting with pad) the plain
    forward's derivative differs from the rule, by design (PyTorch's ``padding_idx``). Held like this, finite
    differences measure the rule: the row's lookups contribute nothing, its other uses (the tied projection)
    everything. As the curvature checks hold ReLU's active sets at the point."""
    held = embedding.weight.data[embedding.padding_idx].copy()
    forward = embedding.forward

    def held_forward(ids):
        out = forward(ids)
        out[np.asarray(ids) == embedding.padding_idx] = held * embedding.scale
        return out
    embedding.forward = held_forward


MARIAN_PAD = V - 1  # Marian keeps pad in the last row (eos 0): nothing may assume pad 0


def as_marian_ids(ids):
    """ids of the checks' vocabulary (PAD 0) with pad moved to the last row: 0 and V - 1 swap places."""
    return np.where(ids == PAD, MARIAN_PAD, np.where(ids == MARIAN_PAD, PAD, ids))


def marian(rng):
    """The pad row's gradient rule alone (repeated ids, pad at position 0 and at the end) and tied with the
    pre-softmax projection (the pad row's gradient then comes from the logits alone); the whole model + loss
    as a Marian model computes it: SiLU, a frozen non-zero logits bias, the rule, pad id V - 1, and a decoder
    input that starts with pad (the start position causal-only), a source row all padding, dropout replayed."""
    out = []
    ids = as_marian_ids(padded_ids(rng, B, S, [S, 4, 2]))
    ids[:, 0] = MARIAN_PAD  # a pad lookup that reaches the output of every row
    ids[0, 1:4] = 5
    m = Embedding(V, D, rng=rng, dtype=F64, padding_idx=MARIAN_PAD)
    hold_pad_lookups(m)
    out.append(GradCase("Embedding (Marian pad row)", "padding_idx V-1, repeated ids", m, {},
                        lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1]))
    src = Embedding(V, D, rng=rng, dtype=F64, padding_idx=MARIAN_PAD)
    tied = Holder(src=src, tgt=Embedding(V, D, weight=src.weight, dtype=F64, padding_idx=MARIAN_PAD),
                  proj=OutputProjection(D, V, weight=src.weight, dtype=F64))
    hold_pad_lookups(tied.src)
    hold_pad_lookups(tied.tgt)
    tgt_ids = ids[:, :T]
    ins = {"h": rng.standard_normal((B, T, D))}
    out.append(GradCase("Embedding (Marian pad row)", "tied with the projection: the pad row's gradient from the "
                        "logits alone", tied, ins, lambda m, i: (m.src(ids), m.tgt(tgt_ids), m.proj(i["h"])),
                        lambda m, g: (m.tgt.backward(g[1]), m.src.backward(g[0]), {"h": m.proj.backward(g[2])})[2]))

    src_ids, tgt, _, _ = padded_batch(rng)
    src_ids, tgt = as_marian_ids(src_ids), as_marian_ids(tgt)
    tgt_out = tgt
    tgt_in = np.concatenate([np.full((B, 1), MARIAN_PAD), tgt[:, :-1]], axis=1)  # decoder_start_token_id = pad
    cfg = small_config(dropout=0.1, activation="silu", logits_bias=True, pad_row_gradient=False, pad_id=MARIAN_PAD)
    model = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=F64)
    model.final_logits_bias[...] = rng.standard_normal(V)
    hold_pad_lookups(model.src_embed)
    hold_pad_lookups(model.tgt_embed)
    crit = LabelSmoothedCrossEntropy(0.1, MARIAN_PAD)

    def fwd(m, i):
        return crit.forward(m(src_ids, tgt_in), tgt_out) * 1.0

    def bwd(m, g):
        m.backward(crit.backward() * g[0])
        return {}

    out.append(GradCase("Transformer+loss (Marian)", "SiLU, logits bias, pad row rule, pad V-1, start from pad, "
                        "dropout 0.1 fixed mask", model, {}, fwd, bwd, before_forward=_replay(model.rng)))
    return out


BUILDERS = {
    "Linear": linear, "Embedding": embedding, "OutputProjection": projection, "PositionalEncoding": positional,
    "LearnedPositionalEmbedding": learned_positions,
    "Dropout": dropout, "ReLU": relu, "LayerNorm": layernorm, "Softmax": softmax,
    "ScaledDotProductAttention": scaled_dot_product, "MultiHeadAttention": multi_head,
    "FeedForward": feedforward, "Residual": residual, "EncoderLayer": encoder_decoder_layers,
    "DecoderLayer": encoder_decoder_layers, "Encoder": stacks, "Decoder": stacks,
    "LabelSmoothedCrossEntropy": loss, "Transformer": transformer,
    "SiLU": silu, "Marian": marian,  # appended: the cases above keep their seeds
}


def build_cases(layers=None, seed: int = 0) -> list[GradCase]:
    """The cases for the named layers (all by default), each builder called once, deterministic in seed."""
    names = list(BUILDERS) if not layers else layers
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise KeyError(f"unknown layer {unknown[0]!r}: choose from {', '.join(BUILDERS)}")
    cases, done = [], set()
    for n in names:
        builder = BUILDERS[n]
        if builder in done:
            continue
        done.add(builder)
        rng = np.random.default_rng([seed, list(BUILDERS).index(n)])
        cases += builder(rng)
    return cases


# -- checks on a trained model's weights ---------------------------------------------------
TRAINED = ("Linear", "LayerNorm", "FeedForward", "MultiHeadAttention", "EncoderLayer", "DecoderLayer", "Embedding",
           "Transformer")


def checkpoint_cases(layers, checkpoint, seed: int = 0) -> list[GradCase]:
    """The same kinds of checks on the weights of a trained checkpoint (float64, dropout off).

    Each named layer is taken from the trained model (the first encoder/decoder
    layer where a layer has several uses) and fed random inputs of the model's
    width, with padding in the batch; ``Transformer`` checks the whole model + loss.
    """
    from numformer.checkpoint import load_checkpoint  # noqa: PLC0415
    from numformer.checkpoint.run_model_file import newest_model_file  # noqa: PLC0415

    names = list(layers) if layers else list(TRAINED)
    unknown = [n for n in names if n not in TRAINED]
    if unknown:
        raise KeyError(f"--checkpoint checks {unknown[0]!r} only on random weights: with a checkpoint choose from "
                       f"{', '.join(TRAINED)}")
    ck = load_checkpoint(newest_model_file(checkpoint), with_optimizer=False)
    cfg = ModelConfig.from_dict(ck.meta["model_config"]).replace(dropout=0.0, attn_dropout=0.0, relu_dropout=0.0)
    model = Transformer(cfg, seed=0, dtype=F64)
    model.load_state_dict(ck.model)
    if not cfg.pad_row_gradient:  # an imported Marian model: its pad row's rule is what is checked
        hold_pad_lookups(model.src_embed)
        hold_pad_lookups(model.tgt_embed)
    rng = np.random.default_rng(seed)
    d, b, s, t = cfg.d_model, 2, 6, 5
    src = rng.integers(4, cfg.vocab_size, size=(b, s))
    src[1, 4:] = cfg.pad_id
    tgt = rng.integers(4, cfg.vocab_size, size=(b, t + 1))
    tgt[1, 3:] = cfg.pad_id
    src_mask = padding_mask(src, cfg.pad_id)
    tgt_mask = causal_mask(t) & padding_mask(tgt[:, :-1], cfg.pad_id)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    x = lambda n=s: rng.standard_normal((b, n, d))  # noqa: E731

    def one(layer, case, module, inputs, forward, backward):
        return GradCase(layer, f"trained {case}", module, inputs, forward, backward)

    build = {
        "Linear": lambda: [one("Linear", "encoder.layers.0.ffn.w_1", enc.ffn.w_1, {"x": x()},
                               lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})],
        "LayerNorm": lambda: [one("LayerNorm", "encoder.layers.0.self_attn_residual.norm",
                                  enc.self_attn_residual.norm, {"x": x()},
                                  lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})],
        "FeedForward": lambda: [one("FeedForward", "encoder.layers.0.ffn", enc.ffn, {"x": x()},
                                    lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])})],
        "MultiHeadAttention": lambda: [
            one("MultiHeadAttention", "encoder.layers.0.self_attn", enc.self_attn, {"x": x()},
                lambda m, i: m(i["x"], mask=src_mask), lambda m, g: {"x": m.backward(g[0])}),
            one("MultiHeadAttention", "decoder.layers.0.cross_attn", dec.cross_attn, {"y": x(t), "memory": x()},
                lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))))],
        "EncoderLayer": lambda: [one("EncoderLayer", "encoder.layers.0", enc, {"x": x()},
                                     lambda m, i: m(i["x"], src_mask), lambda m, g: {"x": m.backward(g[0])})],
        "DecoderLayer": lambda: [one("DecoderLayer", "decoder.layers.0", dec, {"y": x(t), "memory": x()},
                                     lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                                     lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))))],
        "Embedding": lambda: [one("Embedding", "src_embed (tied)", model.src_embed, {},
                                  lambda m, i: m(src), lambda m, g: (m.backward(g[0]), {})[1])],
    }

    def whole():
        crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, cfg.pad_id)

        def fwd(m, i):
            return crit.forward(m(src, tgt[:, :-1]), tgt[:, 1:]) * 1.0

        def bwd(m, g):
            m.backward(crit.backward() * g[0])
            return {}

        return [one("Transformer+loss", "whole model", model, {}, fwd, bwd)]

    build["Transformer"] = whole
    cases = []
    for n in names:
        cases += build[n]()
    return cases
