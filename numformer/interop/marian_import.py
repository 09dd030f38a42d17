"""A Marian model folder (or Hub id) -> a numformer model file: ``python -m numformer.checkpoint import``.

:func:`import_marian` reads a folder written by ``MarianMTModel.save_pretrained`` +
``MarianTokenizer.save_pretrained`` (or fetches a Hub id), checks everything before it writes anything, and
writes an ordinary numformer model file: the weights permuted and renamed
(:mod:`numformer.interop.marian_weights`), the ModelConfig (:mod:`numformer.interop.marian_config`), the
:class:`~numformer.data.marian_vocab.MarianVocab` inside. ``transformers`` is not needed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from . import InteropError
from ..checkpoint import save_checkpoint
from ..data.hf_files import STRING, field, read_json_object
from ..data.marian_vocab import MarianVocab
from ..model import Transformer
from ..presets import ModelConfig
from .hf_folder import fetch, read_hf_weights
from .marian_config import CONFIG, marian_special_ids, model_config_from_marian, refuse
from .marian_weights import (LOGITS_BIAS, POSITION_NAMES, SHARED_NAMES, marian_sinusoids, marian_to_numformer,
                             parameter_map)


def _shared_embedding(state: dict, where) -> np.ndarray:
    found = [n for n in SHARED_NAMES if n in state]
    if not found:
        raise InteropError(f"{where} has no shared embedding (model.shared.weight): not a MarianMTModel's weights")
    first = state[found[0]]
    for n in found[1:]:
        if state[n].shape != first.shape or not np.array_equal(state[n], first):
            refuse(where, f"{n} differs from {found[0]}", "untied embeddings")
    return first


def import_marian(source, out, log=None) -> Path:
    """Read a Marian model (a folder, or a Hub id fetched) and write it as a numformer model file ``out``
    (weights permuted and renamed, the ModelConfig, the MarianVocab inside). Every check happens before
    anything is written; every refusal is one InteropError (or DataError) line."""
    say = log or (lambda *a: None)
    folder = fetch(source)
    where = str(source)
    if not (folder / CONFIG).is_file():
        raise InteropError(f"{where} has no {CONFIG}: not a Hugging Face model folder (save it with "
                           "MarianMTModel.save_pretrained)")
    config_path = folder / CONFIG
    config = read_json_object(config_path)
    cfg = model_config_from_marian(config, where, config_path)
    _, eos, decoder_start = marian_special_ids(config, config_path, cfg.vocab_size, where)
    transformers_version = field(config, "transformers_version", STRING, config_path, default=None, nullable=True)
    vocab = MarianVocab.from_files(folder, eos_id=eos, pad_id=cfg.pad_id, bos_id=decoder_start,
                                   size=cfg.vocab_size)
    n_pieces = len(vocab.pieces)
    state = read_hf_weights(folder)
    shared = _shared_embedding(state, where)
    if shared.ndim != 2 or shared.shape[1] != cfg.d_model:
        raise InteropError(f"{where}'s embedding has shape {shared.shape}, its config says d_model {cfg.d_model}")
    if shared.shape[0] != cfg.vocab_size or n_pieces != cfg.vocab_size:
        raise InteropError(f"{where}'s vocabulary size disagrees with its weights: vocab.json has {n_pieces} "
                           f"pieces, the embedding {shared.shape[0]} rows, config.json says vocab_size "
                           f"{cfg.vocab_size}")
    for name in POSITION_NAMES:
        if name in state:
            table = state.pop(name)
            want = marian_sinusoids(table.shape[0], cfg.d_model)
            if table.shape[1] != cfg.d_model or not np.allclose(table, want, atol=1e-4):
                refuse(where, f"{name} is not Marian's sinusoid table", "positions numformer does not compute")
    for name in SHARED_NAMES[1:]:
        state.pop(name, None)
    state["model.shared.weight"] = shared
    for stack, n in (("encoder", cfg.layers), ("decoder", cfg.n_decoder_layers)):
        # the last layer the config names, before the map of every layer is built (a config.json claiming
        # a billion layers would otherwise build it)
        if f"model.{stack}.layers.{n - 1}.fc1.weight" not in state:
            raise InteropError(f"{where}'s weights have no layer {n - 1} of the {stack}, which config.json's "
                               f"{stack}_layers {n} asks for: the weights are not the model config.json describes")
    mapped = parameter_map(cfg.layers, cfg.n_decoder_layers)
    known = {theirs for _, theirs, _ in mapped}
    extra = sorted(set(state) - known)
    if extra:
        refuse(where, f"weights numformer has no place for ({extra[0]}{', ...' if len(extra) > 1 else ''})",
               "a layout other than MarianMTModel's")
    missing = [theirs for _, theirs, kind in mapped if theirs not in state and kind != LOGITS_BIAS]
    if missing:
        raise InteropError(f"{where}'s weights lack {missing[0]}{' and more' if len(missing) > 1 else ''}: "
                           "the file is not the model its config.json describes")
    if "final_logits_bias" not in state:
        state["final_logits_bias"] = np.zeros((1, cfg.vocab_size), dtype=shared.dtype)
    dtype = np.float64 if shared.dtype == np.float64 else np.float32
    ours = {k: v.astype(dtype, copy=False) for k, v in
            marian_to_numformer(state, cfg.layers, cfg.n_decoder_layers, cfg.d_model).items()}
    _check_fits(cfg, ours, where, dtype)
    blob = vocab.to_bytes()
    meta = {"model_config": cfg.to_dict(), "vocab_size": cfg.vocab_size,
            "vocab_sha256": hashlib.sha256(blob).hexdigest(),
            "imported_from": {"format": "hf-marian", "source": where,
                              "transformers_version": transformers_version,
                              "decoder_start_token_id": decoder_start, "eos_token_id": eos,
                              "pad_token_id": cfg.pad_id}}
    save_checkpoint(out, ours, meta, vocab=blob)
    say(f"imported {where}: {cfg.layers}+{cfg.n_decoder_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.vocab_size} pieces, {getattr(cfg, 'activation', 'relu')}")
    return Path(out)


def _check_fits(cfg: ModelConfig, state: dict, where, dtype) -> None:
    """The mapped weights load into numformer's Transformer of this config (names and shapes)."""
    expected = {n: v.shape for n, v in Transformer(cfg, seed=0, dtype=np.float32).state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise InteropError(f"{where}: numformer's model needs {name}, which the mapping did not give")
        if state[name].shape != shape:
            raise InteropError(f"{where}: {name} has shape {state[name].shape} after the mapping, numformer's model "
                               f"needs {shape}: the weights do not fit their config.json")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise InteropError(f"{where}: the mapping gave {extra[0]}, which numformer's model of this config lacks")


__all__ = ["import_marian"]
