"""Exporting a trained model as one file, ``.npz`` or ``.safetensors``: weights, config and vocabulary,
no optimizer state (``python -m numformer.checkpoint export``). The folders of other libraries (``--format
hf``, ``--format ctranslate2``) are written by :mod:`numformer.interop`, from :func:`model_to_export` too."""
from __future__ import annotations

import hashlib
from pathlib import Path

from . import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from ..layers import Linear
from ..model import Transformer
from ..presets import ModelConfig
from .output_format import FILE_SUFFIXES, output_format
from .run_model_file import newest_model_file, vocab_beside
from .safetensors_file import save_safetensors

# The meta entries a model file keeps; the rest (RNG, data position, timings) only resumes training.
MODEL_META = ("model_config", "vocab_size", "vocab_sha256", "step", "data", "averaged_from")


#: The one-file formats export writes (the folders are :data:`~numformer.checkpoint.output_format.FOLDER_FORMATS`).
FORMATS = tuple(FILE_SUFFIXES.values())


def model_to_export(source) -> tuple[Path, Checkpoint, bytes]:
    """(model file, its checkpoint without optimizer state, the serialized vocabulary) of the model a run folder
    or model file names (:func:`numformer.checkpoint.run_model_file.newest_model_file`). The vocabulary is the
    file's own, else the run folder's ``spm.model`` (its sha256 then recorded in the meta when absent)."""
    src = newest_model_file(source)
    ck = load_checkpoint(src, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{src} has no model config in its metadata: not a numformer training checkpoint")
    vocab = ck.vocab
    if vocab is None:
        spm = vocab_beside(src)
        if not spm.is_file():
            raise CheckpointError(f"{src} carries no vocabulary and {spm} does not exist: export from the run folder")
        vocab = spm.read_bytes()
        ck.meta.setdefault("vocab_sha256", hashlib.sha256(vocab).hexdigest())
    return src, ck, vocab


def export_model(source, out, fmt: str | None = None) -> Path:
    """Write the model a run folder or checkpoint names (see :func:`model_to_export`) as one file. ``fmt``:
    "npz" or "safetensors" (default: from ``out``'s suffix)."""
    fmt = output_format(out, fmt, allowed=FORMATS)
    src, ck, vocab = model_to_export(source)
    meta = {k: ck.meta[k] for k in MODEL_META if k in ck.meta}
    meta["exported_from"] = str(src)
    if fmt == "npz":
        save_checkpoint(out, ck.model, meta, vocab=vocab)
    else:
        save_safetensors(out, ck.model, meta, vocab, _linear_weight_names(meta["model_config"]))
    return Path(out)


def _linear_weight_names(model_config: dict) -> list:
    """The names of the Linear weights of the model ``model_config`` describes (numformer stores them
    (d_in, d_out); a PyTorch reader transposes them)."""
    model = Transformer(ModelConfig.from_dict(model_config).checked(), seed=0)
    names = {n for n, _ in model.named_parameters()}
    linear = {f"{n}.weight" if n else "weight" for n, m in model.named_modules() if isinstance(m, Linear)}
    return sorted(linear & names)
