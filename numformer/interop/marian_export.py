"""A numformer model -> a folder ``MarianMTModel.from_pretrained`` and ``MarianTokenizer.from_pretrained``
load: ``python -m numformer.checkpoint export RUN --format hf``.

:func:`export_marian` writes the weights (:mod:`numformer.interop.marian_weights`), ``config.json`` and
``generation_config.json`` (:mod:`numformer.interop.marian_config`) and the tokenizer files;
:func:`export_marian_model` does so for the model a run folder or model file names. ``safetensors`` writes
the weights; ``transformers`` is needed only to load the result.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import InteropError
from ..checkpoint import CheckpointError
from ..checkpoint.export import model_to_export
from ..data.marian_vocab import MarianVocab, vocab_from_bytes
from ..files import atomic_folder
from ..presets import ModelConfig
from .hf_folder import GENERATION_CONFIG, SAFETENSORS, SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG
from .marian_config import CONFIG, generation_config, marian_config_from_numformer
from .marian_weights import numformer_to_marian


def _tokenizer_files(vocab, folder: Path, max_len: int) -> None:
    """source.spm, target.spm, vocab.json, tokenizer_config.json and special_tokens_map.json for MarianTokenizer."""
    if isinstance(vocab, MarianVocab):
        vocab.save_files(folder)
        tokens, langs = vocab.tokens, (vocab.source_lang, vocab.target_lang)
    else:  # numformer's shared sentencepiece model: both sides, its own ids
        proto = vocab.to_bytes()
        (folder / "source.spm").write_bytes(proto)
        (folder / "target.spm").write_bytes(proto)
        pieces = {vocab.id_to_piece(i): i for i in range(vocab.size)}
        (folder / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False, indent=2), encoding="utf-8")
        tokens = {"eos": vocab.id_to_piece(vocab.eos_id), "unk": vocab.id_to_piece(vocab.unk_id),
                  "pad": vocab.id_to_piece(vocab.pad_id)}
        langs = (None, None)
    special = {f"{r}_token": tokens[r] for r in ("eos", "unk", "pad")}
    config = dict(special, tokenizer_class="MarianTokenizer", source_lang=langs[0], target_lang=langs[1],
                  model_max_length=int(max_len), separate_vocabs=False, sp_model_kwargs={})
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(special, ensure_ascii=False, indent=2), encoding="utf-8")


def export_marian(model_state: dict, cfg: ModelConfig, vocab, out) -> Path:
    """Write a numformer model (weights ``model_state`` by numformer name, its config, its vocabulary: a
    SubwordVocab or a MarianVocab) as a folder ``MarianMTModel.from_pretrained`` and
    ``MarianTokenizer.from_pretrained`` load. Written beside ``out`` and renamed into place: on any error
    nothing is left; ``out`` must not exist or be an empty folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InteropError(f"{out} already exists{' and is not empty' if out.is_dir() else ''}: choose a new "
                           "folder for the Hugging Face model")
    config = marian_config_from_numformer(cfg, vocab)
    if vocab.size != cfg.vocab_size:
        raise InteropError(f"the vocabulary has {vocab.size} pieces, the model {cfg.vocab_size} rows")
    weights = numformer_to_marian(model_state, cfg.layers, cfg.n_decoder_layers, cfg.d_model)
    if "final_logits_bias" not in weights:
        weights["final_logits_bias"] = np.zeros((1, cfg.vocab_size), dtype=weights["model.shared.weight"].dtype)
    dtypes = {str(v.dtype) for v in weights.values()}
    config["dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    from safetensors.numpy import save_file  # noqa: PLC0415

    def fill(stage: Path) -> None:
        save_file(weights, str(stage / SAFETENSORS), metadata={"format": "pt"})
        (stage / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        (stage / GENERATION_CONFIG).write_text(json.dumps(generation_config(cfg, vocab), indent=2), encoding="utf-8")
        _tokenizer_files(vocab, stage, cfg.max_len)
    return atomic_folder(out, fill)


def export_marian_model(source, out) -> Path:
    """The model a run folder or model file names (:func:`numformer.checkpoint.export.model_to_export`: its
    averaged or newest checkpoint, its own vocabulary or the run's ``spm.model``) as the Hugging Face Marian
    folder ``out`` (:func:`export_marian`)."""
    src, ck, vocab = model_to_export(source)
    try:
        cfg = ModelConfig.from_dict(ck.meta["model_config"]).checked()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{src} has an unreadable model config ({exc}): it was written by another "
                              "numformer version or is corrupt") from None
    return export_marian(ck.model, cfg, vocab_from_bytes(vocab), out)


__all__ = ["export_marian", "export_marian_model"]
