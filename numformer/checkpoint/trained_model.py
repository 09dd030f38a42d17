"""A trained model from a model file or a run folder: its weights, its configuration and its vocabulary.

What ``translate.py``, ``python -m grad_checks --checkpoint``, ``python -m numformer.attention_maps`` and
the notebook load: one file is a whole model (the checkpoint carries its config and its sentencepiece
model); older checkpoints take the vocabulary from beside them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import run_file_names
from ..backend import resolve_device, xp_for
from . import CheckpointError, load_checkpoint, vocab_fingerprint
from ..data import DataError, SubwordVocab
from ..data.marian_vocab import vocab_from_bytes
from ..errors import first_line
from ..file_kinds import shown
from ..model import Transformer
from ..presets import ModelConfig
from .run_model_file import newest_model_file, vocab_beside


def check_vocab(vocab, meta: dict, vocab_path, what) -> None:
    """The vocabulary must be the one the model was trained with: same size, and the same file when the
    checkpoint recorded its fingerprint (checkpoints written before fingerprints only have the size)."""
    cfg_size = meta.get("model_config", {}).get("vocab_size")
    if cfg_size is not None and vocab.size != cfg_size:
        raise DataError(f"vocabulary {shown(vocab_path)} has {vocab.size} pieces but {what} expects {cfg_size}: "
                        f"use the {run_file_names.VOCAB} of the same run")
    expected = meta.get("vocab_sha256")
    if expected and vocab_fingerprint(vocab) != expected:
        raise DataError(f"vocabulary {shown(vocab_path)} is not the one {what} was trained with (its sha256 differs): "
                        f"use the {run_file_names.VOCAB} of the same run")


def load_model(checkpoint, vocab_path=None, device: str | None = None):
    """(model in eval mode on ``device``, vocab, model file path) from a model file or a run folder.

    The vocabulary: ``vocab_path`` when given; else the one the file carries (a
    :class:`~numformer.data.SubwordVocab` or, for a model imported from Hugging Face Marian, a
    :class:`~numformer.data.marian_vocab.MarianVocab`); else ``spm.model`` of the run folder the file sits in
    (:func:`~numformer.checkpoint.run_model_file.vocab_beside`), for a checkpoint that carries none. It must be
    the one the model was trained with (size, and sha256 when the file recorded it).
    """
    path = newest_model_file(checkpoint)  # a run folder: its fresh average, else its newest checkpoint
    ck = load_checkpoint(path, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{shown(path)} has no model config in its metadata: not a numformer training checkpoint")
    try:
        cfg = ModelConfig.from_dict(ck.meta["model_config"])
        cfg.checked()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{shown(path)} has an unreadable model config ({first_line(exc)}): "
                              "it was written by another numformer version or is corrupt") from None
    if vocab_path is None and ck.vocab is not None:
        try:
            vocab = vocab_from_bytes(ck.vocab)
        except Exception:  # noqa: BLE001  (sentencepiece's parse errors have no common class)
            raise CheckpointError(f"{shown(path)} carries an unreadable vocabulary: it is corrupt; pass --vocab PATH "
                                  "to "
                                  f"the run's {run_file_names.VOCAB} or use another checkpoint") from None
        check_vocab(vocab, ck.meta, "(the one in the file)", f"checkpoint {shown(path)}")
    else:
        vocab_path = vocab_beside(path) if vocab_path is None else Path(vocab_path)
        if vocab_path.is_dir():  # said as a folder, not "not found"
            raise DataError(f"vocabulary {shown(vocab_path)} is a folder: give a file (the run's "
                            f"{run_file_names.VOCAB})")
        if not vocab_path.is_file():
            raise DataError(f"vocabulary {shown(vocab_path)} not found: pass --vocab PATH to the run's "
                            f"{run_file_names.VOCAB}")
        vocab = SubwordVocab.load(vocab_path)
        check_vocab(vocab, ck.meta, vocab_path, f"checkpoint {shown(path)}")
    xp = xp_for(resolve_device(device))
    model = Transformer(cfg, seed=0, dtype=np.float32)
    try:
        model.load_state_dict(ck.model)
    except ValueError as exc:
        raise CheckpointError(f"{shown(path)} does not fit its own config ({first_line(exc)}): it is corrupt, "
                              "use another checkpoint of the run") from None
    model.to(xp)
    return model.eval(), vocab, path
