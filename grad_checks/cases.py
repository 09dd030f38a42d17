"""The gradient checks: every layer of numformer and the whole model plus loss, in float64.

Each builder returns GradCases with padding in the batch, source and target of
different lengths, a source row that is all padding under a target row of real
tokens (fully masked attention rows, whose scores must get no gradient),
four heads, and random inputs; dropout is either off or replayed with a fixed mask
(the model's RandomState is restored before every forward).

Every activation of numformer's table (numformer.activations) but ReLU, which has its own builder (kept away
from its kink), is checked alone and in the feed-forward network by a builder made from its row
(:func:`~grad_checks.layer_cases.activation_cases`): SiLU, what a Marian (opus-mt) model computes, GELU, ...;
every norm of numformer.norms but LayerNorm alone, in the residual sub-layer and in the whole model
(:func:`~grad_checks.model_cases.norm_cases`); :func:`table_builders` makes both from the tables.
``Marian`` checks the pad row's gradient rule (``Embedding(padding_idx=...)``), alone and tied with the
pre-softmax projection, and the whole model with SiLU, a frozen logits bias, that rule and a decoder input
starting with pad.

Each builder's random numbers are seeded by its name (:func:`case_seed`, a CRC-32 of it), not by its place in
:data:`BUILDERS`: a builder may be added anywhere and every other keeps its inputs. Each case's probes (the
upstream gradients and the entries and directions sampled) are seeded by the builder's name and the case's
(:func:`probe_seed`): a builder or a case added, removed or moved changes no other case's figures. (A case
inserted before another of the same builder still moves that one's inputs, which come from the builder's
stream: add a case at the end of its builder, or as a builder of its own.)

This file is the index (:data:`BUILDERS`, :func:`build_cases`) and the checks on a trained model's weights
(:func:`checkpoint_cases`); the cases live by job: grad_checks/case_helpers.py (shapes, padded batches,
configs, holders), grad_checks/layer_cases.py (each layer alone), grad_checks/model_cases.py (layers of
layers, the stacks, the whole model, Marian's). Every name they export stays importable from here.
"""
from __future__ import annotations

import contextlib
import zlib

import numpy as np

from numformer.activations import ACTIVATIONS
from numformer.finite_differences import GradCase
from numformer.layers.registry import replaced
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer, causal_mask, padding_mask
from numformer.norms import NORMS
from numformer.presets import ModelConfig

from .case_helpers import (B, D, DFF, F64, HEADS, MARIAN_PAD, PAD, REGISTERED, S, T, V, HeldPadEmbedding, Holder,
                           _replay, as_marian_ids, forward_mode, loss_forward_mode, padded_batch, padded_ids,
                           small_config)
from .layer_cases import SoftmaxFunction, activation_cases
from .model_cases import norm_cases

__all__ = ["B", "BUILDERS", "D", "DFF", "F64", "HEADS", "MARIAN_PAD", "PAD", "S", "T", "TRAINED", "V",
           "HeldPadEmbedding", "Holder", "SoftmaxFunction", "_replay", "as_marian_ids", "build_cases",
           "case_seed", "checkpoint_cases", "named_cases", "padded_batch", "padded_ids", "probe_seed", "small_config"]


#: layer name -> the builder of its cases: every builder of grad_checks/layer_cases.py and model_cases.py, as it
#: registered itself (``@checks("Linear")``, in the order they are defined), then those made from the tables' rows
BUILDERS = dict(REGISTERED)


def table_builders(known=BUILDERS) -> dict:
    """The builders made from the tables' rows, read now: every activation (numformer.activations) and every norm
    (numformer.norms) without a builder in ``known`` (ReLU and LayerNorm have theirs), each under its layer's
    name: a row added to a table is checked with no line here."""
    made = {row.layer: activation_cases(row.name) for row in ACTIVATIONS.values() if row.layer not in known}
    made.update({row.layer: norm_cases(row.name) for row in NORMS.values() if row.layer not in known})
    return made


BUILDERS.update(table_builders())


def case_seed(name: str, seed: int = 0) -> list:
    """The random seed of the builder called ``name``: ``[seed, CRC-32 of the name]``, the same wherever the
    builder stands in :data:`BUILDERS` (a builder shared by several names is seeded by its first name)."""
    first = next(n for n, b in BUILDERS.items() if b is BUILDERS[name])
    return [seed, zlib.crc32(first.encode())]


def named_cases(layers=None, seed: int = 0) -> list[tuple[str, GradCase]]:
    """(the builder's name, case) for the named layers (all by default), each builder called once,
    deterministic in seed; a builder shared by several names is named by its first (:func:`case_seed`)."""
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
        rng = np.random.default_rng(case_seed(n, seed))
        first = next(k for k, b in BUILDERS.items() if b is builder)
        cases += [(first, case) for case in builder(rng)]
    return cases


def build_cases(layers=None, seed: int = 0) -> list[GradCase]:
    """The cases for the named layers (all by default), each builder called once, deterministic in seed."""
    return [case for _, case in named_cases(layers, seed)]


def probe_seed(builder: str, case: GradCase, seed: int = 0) -> list:
    """The seed of one case's probes (its upstream gradients, sampled entries and directions, what
    :func:`numformer.finite_differences.run_case` draws): ``[seed, CRC-32 of the builder's name, CRC-32 of the
    case's layer and name]``. Every case draws from a stream of its own, so adding, removing or reordering
    builders or cases changes no other case's figures (tests/checks/test_probe_seeds.py shuffles them)."""
    return [seed, zlib.crc32(builder.encode()), zlib.crc32(f"{case.layer}\0{case.case}".encode())]


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
    held = not cfg.pad_row_gradient  # an imported Marian model: its pad row's rule is what is checked
    with replaced({"Embedding": HeldPadEmbedding}) if held else contextlib.nullcontext():
        model = Transformer(cfg, seed=0, dtype=F64)
    model.load_state_dict(ck.model)  # in place, into the matrices the embeddings hold rows of: hold them now
    if held:
        model.src_embed.hold_pad_row()
        model.tgt_embed.hold_pad_row()
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

    def one(layer, case, module, inputs, forward, backward, modes):
        return GradCase(layer, f"trained {case}", module, inputs, forward, backward, **modes)

    build = {
        "Linear": lambda: [one("Linear", "encoder.layers.0.ffn.w_1", enc.ffn.w_1, {"x": x()},
                               lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, forward_mode("x"))],
        "LayerNorm": lambda: [one("LayerNorm", "encoder.layers.0.self_attn_residual.norm",
                                  enc.self_attn_residual.norm, {"x": x()},
                                  lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, forward_mode("x"))],
        "FeedForward": lambda: [one("FeedForward", "encoder.layers.0.ffn", enc.ffn, {"x": x()},
                                    lambda m, i: m(i["x"]), lambda m, g: {"x": m.backward(g[0])}, forward_mode("x"))],
        "MultiHeadAttention": lambda: [
            one("MultiHeadAttention", "encoder.layers.0.self_attn", enc.self_attn, {"x": x()},
                lambda m, i: m(i["x"], mask=src_mask), lambda m, g: {"x": m.backward(g[0])}, forward_mode("x")),
            one("MultiHeadAttention", "decoder.layers.0.cross_attn", dec.cross_attn, {"y": x(t), "memory": x()},
                lambda m, i: m(i["y"], i["memory"], mask=src_mask),
                lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))), forward_mode("y", "memory"))],
        "EncoderLayer": lambda: [one("EncoderLayer", "encoder.layers.0", enc, {"x": x()},
                                     lambda m, i: m(i["x"], src_mask), lambda m, g: {"x": m.backward(g[0])},
                                     forward_mode("x"))],
        "DecoderLayer": lambda: [one("DecoderLayer", "decoder.layers.0", dec, {"y": x(t), "memory": x()},
                                     lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                                     lambda m, g: dict(zip(("y", "memory"), m.backward(g[0]))),
                                     forward_mode("y", "memory"))],
        "Embedding": lambda: [one("Embedding", "src_embed (tied)", model.src_embed, {},
                                  lambda m, i: m(src), lambda m, g: (m.backward(g[0]), {})[1], forward_mode())],
    }

    def whole():
        crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, cfg.pad_id)

        def fwd(m, i):
            return crit.forward(m(src, tgt[:, :-1]), tgt[:, 1:]) * 1.0

        def bwd(m, g):
            m.backward(crit.backward() * g[0])
            return {}

        return [one("Transformer+loss", "whole model", model, {}, fwd, bwd, loss_forward_mode(crit, model))]

    build["Transformer"] = whole
    cases = []
    for n in names:
        cases += build[n]()
    return cases
