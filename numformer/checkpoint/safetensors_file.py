"""A model as a ``.safetensors`` file, the format the field shares weights in; written and read with the
``safetensors`` package's NumPy API (imported only when such a file is written or read).

Tensors: the weights under numformer's parameter names (tied weights once), in numformer's layout, host
float32. Metadata (strings, as safetensors allows): ``format`` = "numformer"; ``numformer_meta``: the
checkpoint's JSON meta (``model_config`` holds the architecture); ``model_config``: that config again on
its own; ``spm_model_base64``: the sentencepiece model (``marian_vocab_base64`` instead: a Marian
vocabulary's blob, :class:`numformer.data.marian_vocab.MarianVocab`); ``linear_weights``: a JSON list of the Linear
weights, which numformer stores as (d_in, d_out) for ``y = x W + b`` (``torch.nn.Linear`` keeps
(d_out, d_in): transpose them when loading into PyTorch).

:func:`numformer.checkpoint.load_checkpoint` tells the two formats apart by content
(:func:`is_safetensors`) and reads this one through :func:`load_safetensors`.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from ..data.marian_vocab import is_marian_vocab_bytes
from ..errors import NumformerError
from ..files import atomic_write_bytes
from ..file_kinds import shown

FORMAT = "numformer"  # the ``format`` metadata entry that marks a numformer model
SPM_ENTRY, MARIAN_VOCAB_ENTRY = "spm_model_base64", "marian_vocab_base64"  # the vocabulary's metadata entry


class SafetensorsError(NumformerError, ValueError):
    """A ``.safetensors`` model that cannot be written or read; the message is one line."""


def is_safetensors(path) -> bool:
    """A safetensors file starts with its header's length (8 bytes, little-endian) and then ``{``;
    an .npz starts with a zip signature. Decided by content, so a renamed file still loads."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def _package():
    try:
        import safetensors.numpy  # noqa: PLC0415  (only for .safetensors files)
    except ImportError:
        raise SafetensorsError("reading or writing .safetensors needs the safetensors package: "
                               "run `pip install safetensors`") from None
    return safetensors


def _metadata(path) -> dict:
    with _package().safe_open(str(path), framework="numpy") as f:
        return dict(f.metadata() or {})


def read_safetensors_meta(path) -> dict:
    """The checkpoint meta a numformer ``.safetensors`` file carries (``{}`` when it has none); the
    weights are not read. Raises whatever reading the file raises."""
    return json.loads(_metadata(path).get("numformer_meta", "{}"))


def save_safetensors(path, model_state: dict, meta: dict, vocab: bytes | None = None, linear_weights=()) -> None:
    """Write a model (weights ``model_state``, checkpoint ``meta``, the serialized sentencepiece model
    ``vocab``) as safetensors, atomically; ``linear_weights``: the names of the Linear weights."""
    st = _package()
    tensors = {k: np.ascontiguousarray(v) for k, v in model_state.items()}
    metadata = {"format": FORMAT, "numformer_meta": json.dumps(meta),
                "model_config": json.dumps(meta.get("model_config", {})),
                "linear_weights": json.dumps(sorted(linear_weights))}
    if vocab is not None:
        key = MARIAN_VOCAB_ENTRY if is_marian_vocab_bytes(vocab) else SPM_ENTRY
        metadata[key] = base64.b64encode(bytes(vocab)).decode("ascii")
    atomic_write_bytes(path, st.numpy.save(tensors, metadata=metadata))


def load_safetensors(path) -> tuple[dict, dict, bytes | None]:
    """(weights, meta, vocabulary or None) of a model written by :func:`save_safetensors`; every failure
    is a one-line SafetensorsError."""
    st = _package()
    path = Path(path)
    try:
        metadata = _metadata(path)
        model = st.numpy.load_file(str(path))
        meta = json.loads(metadata.get("numformer_meta", "null"))
        vocab = metadata.get(SPM_ENTRY, metadata.get(MARIAN_VOCAB_ENTRY))
        vocab = base64.b64decode(vocab, validate=True) if vocab is not None else None
    except OSError as exc:
        raise SafetensorsError(f"cannot read {shown(path)}: {exc.strerror or exc}: check the file and its "
                               "permissions") from None
    except Exception as exc:  # noqa: BLE001  (SafetensorError, JSON, base64: a damaged file)
        raise SafetensorsError(f"safetensors file {shown(path)} is truncated or corrupt ({type(exc).__name__}): "
                               "export it again") from None
    if metadata.get("format") != FORMAT or not isinstance(meta, dict):
        raise SafetensorsError(f"{shown(path)} is a safetensors file but not a numformer model (no numformer "
                               "metadata): "
                               "export one with python -m numformer.checkpoint export")
    if not model:
        raise SafetensorsError(f"{shown(path)} holds no model weights")
    return model, meta, vocab
