"""The checkpoint file: a trained model (and, for a training checkpoint, the state to resume it) as one
portable ``.npz``, written atomically (:mod:`numformer.files`).

A checkpoint holds host numpy arrays only (a model trained with cupy loads on a
machine without it) and no pickles (``np.load(allow_pickle=False)``):

* ``model/<parameter name>``: the weights (tied weights once);
* ``optim/step``, ``optim/m/<i>``, ``optim/v/<i>``: Adam's state, when saved;
* ``meta``: UTF-8 JSON (model config, training step, RNG and data position, the sha256 of the
  sentencepiece model the run used...);
* ``vocab/spm``: the serialized sentencepiece model itself (uint8), so that one file is a whole
  model: ``translate.py --model model.npz`` needs nothing beside it. Files without this entry load
  too, with the vocabulary from ``--vocab`` or the run folder;
* ``vocab/marian`` instead, for a model imported from Hugging Face Marian
  (:mod:`numformer.interop.marian`): one blob with its two sentencepiece models and joint id map
  (:class:`numformer.data.marian_vocab.MarianVocab`'s ``to_bytes``). ``Checkpoint.vocab`` holds either
  blob; :func:`numformer.data.marian_vocab.vocab_from_bytes` tells them apart by their first bytes.

:func:`load_checkpoint` and :func:`read_meta` also read a model exported as ``.safetensors``
(:mod:`numformer.checkpoint.safetensors_file`), told apart by content. Around the file: averaging
(:mod:`numformer.checkpoint.averaging`), exporting (:mod:`numformer.checkpoint.export`), which file of a run folder
is its model (:mod:`numformer.checkpoint.run_model_file`), a trained model with its config and vocabulary
loaded from a file or run folder (:mod:`numformer.checkpoint.trained_model`), and the names the output of
``python -m numformer.checkpoint`` is given (:mod:`numformer.checkpoint.output_format`).

This package is the floor below :mod:`numformer.interop` (which reads and writes model files) and never
imports it; the command line ``python -m numformer.checkpoint`` sits above both, in
:mod:`numformer.checkpoint_command`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data.marian_vocab import is_marian_vocab_bytes
from ..errors import NumformerError
from ..file_kinds import not_a_model, shown
from ..files import atomic_write
from .safetensors_file import SafetensorsError, is_safetensors, load_safetensors, read_safetensors_meta

VOCAB_KEY = "vocab/spm"  # the sentencepiece model's bytes inside a checkpoint
MARIAN_VOCAB_KEY = "vocab/marian"  # a Marian vocabulary's blob (two sentencepiece models and the joint id map)


class CheckpointError(NumformerError, ValueError):
    """A checkpoint that is missing, truncated, corrupt or does not fit; the message is one line."""


@dataclass
class Checkpoint:
    """A checkpoint as read back (or about to be written): the entries above, as Python objects."""

    model: dict                       # name -> numpy array
    meta: dict = field(default_factory=dict)
    optimizer: dict | None = None     # Adam.state_dict() layout
    vocab: bytes | None = None        # serialized sentencepiece model or Marian vocabulary (None: not in the file)


def read_meta(path) -> dict:
    """Only the ``meta`` entry of a checkpoint (the weights are not read); a CheckpointError if unreadable."""
    path = Path(path)
    try:
        if is_safetensors(path):
            return read_safetensors_meta(path)
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
    except Exception as exc:  # noqa: BLE001  (zip, JSON, missing entry: all mean "cannot tell")
        raise CheckpointError(f"cannot read the metadata of {shown(path)} ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{shown(path)} is not a numformer checkpoint (its 'meta' entry is not a JSON object)")
    return meta


def vocab_fingerprint(vocab) -> str:
    """sha256 of a vocabulary's serialized bytes (sentencepiece model or Marian blob); checkpoints record it in
    ``meta["vocab_sha256"]`` so that loading with another vocabulary fails instead of translating garbage."""
    return hashlib.sha256(vocab.to_bytes()).hexdigest()


def save_checkpoint(path, model_state: dict, meta: dict | None = None, optimizer_state: dict | None = None,
                    vocab: bytes | None = None) -> None:
    """Write a checkpoint atomically. model_state: name -> array (e.g. ``model.state_dict()``);
    vocab: the serialized vocabulary (``SubwordVocab.to_bytes()``, or ``MarianVocab.to_bytes()``, stored as
    ``vocab/marian``), carried in the file."""
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_state.items()}
    if vocab is not None:
        vocab = bytes(vocab)
        key = MARIAN_VOCAB_KEY if is_marian_vocab_bytes(vocab) else VOCAB_KEY
        arrays[key] = np.frombuffer(vocab, dtype=np.uint8)
    if optimizer_state is not None:
        arrays["optim/step"] = np.asarray(optimizer_state["step_count"], dtype=np.int64)
        for i, (m, v) in enumerate(zip(optimizer_state["m"], optimizer_state["v"])):
            arrays[f"optim/m/{i}"] = np.asarray(m)
            arrays[f"optim/v/{i}"] = np.asarray(v)
    arrays["meta"] = np.frombuffer(json.dumps(meta or {}).encode("utf-8"), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **arrays))


def load_checkpoint(path, with_optimizer: bool = True) -> Checkpoint:
    """Read a checkpoint; every failure is a one-line CheckpointError saying what to do."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{shown(path)} is a folder: give a model file (a checkpoint .npz or .safetensors)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {shown(path)} does not exist: check the path or train a model first")
    problem = not_a_model(path)  # a whole file of another kind is named as what it is, never called corrupt
    if problem is not None:
        raise CheckpointError(problem)
    if is_safetensors(path):
        try:
            model, meta, vocab = load_safetensors(path)
        except SafetensorsError as exc:
            raise CheckpointError(str(exc)) from None
        return Checkpoint(model=model, meta=meta, vocab=vocab)
    vocab = None
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if "meta" not in names:
                raise CheckpointError(f"{shown(path)} is not a numformer checkpoint (no 'meta' entry)")
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            model = {k[len("model/"):]: z[k] for k in names if k.startswith("model/")}
            optimizer = None
            if with_optimizer and "optim/step" in names:
                n = sum(1 for k in names if k.startswith("optim/m/"))
                optimizer = {"step_count": int(z["optim/step"]),
                             "m": [z[f"optim/m/{i}"] for i in range(n)],
                             "v": [z[f"optim/v/{i}"] for i in range(n)]}
            for key in (VOCAB_KEY, MARIAN_VOCAB_KEY):
                if key in names:
                    vocab = z[key].tobytes()
    except CheckpointError:
        raise
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error, not numpy's "not an npz file"
            raise CheckpointError(f"cannot read checkpoint {shown(path)}: {exc.strerror}: check the file and its "
                                  "permissions") from None
        raise CheckpointError(f"checkpoint {shown(path)} is truncated or corrupt ({type(exc).__name__}): "
                              "use an earlier checkpoint from the same folder") from None
    except Exception as exc:  # a damaged file fails in many ways: zip, CRC, npy header, JSON, MemoryError
        raise CheckpointError(f"checkpoint {shown(path)} is truncated or corrupt ({type(exc).__name__}): "
                              "use an earlier checkpoint from the same folder") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{shown(path)} is not a numformer checkpoint (its 'meta' entry is not a JSON object)")
    if not model:
        raise CheckpointError(f"{shown(path)} holds no model weights")
    return Checkpoint(model=model, meta=meta, optimizer=optimizer, vocab=vocab)
