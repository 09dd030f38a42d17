"""Exporting a trained model as one file, ``.npz`` or ``.safetensors``: weights, config and vocabulary,
no optimizer state (``python -m numformer.checkpoint export``); or, ``--format hf``, as a Hugging Face
Marian folder (:func:`numformer.interop.marian.export_marian`: ``MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` load it)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from .. import run_files
from . import CheckpointError, load_checkpoint, save_checkpoint
from ..layers import Linear
from ..model import Transformer
from ..presets import ModelConfig
from .output_format import output_format
from .run_model_file import newest_model_file
from .safetensors_file import save_safetensors

# The meta entries a model file keeps; the rest (RNG, data position, timings) only resumes training.
MODEL_META = ("model_config", "vocab_size", "vocab_sha256", "step", "data", "averaged_from")


#: The formats export writes: one file (npz, safetensors) or a Hugging Face Marian folder (hf).
FORMATS = ("npz", "safetensors", "hf")


def export_model(source, out, fmt: str | None = None) -> Path:
    """Write the model a run folder or checkpoint names (see :func:`numformer.checkpoint.run_model_file.newest_model_file`)
    as one file, or as a Hugging Face Marian folder. ``fmt``: "npz", "safetensors" or "hf" (default: from
    ``out``'s suffix, npz or safetensors). The vocabulary is the file's own, else the run folder's ``spm.model``."""
    fmt = output_format(out, fmt, allowed=FORMATS)
    src = newest_model_file(source)
    ck = load_checkpoint(src, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{src} has no model config in its metadata: not a numformer training checkpoint")
    vocab = ck.vocab
    if vocab is None:
        run_dir = src.parent.parent if src.parent.name == run_files.CHECKPOINTS else src.parent
        spm = run_dir / run_files.VOCAB
        if not spm.is_file():
            raise CheckpointError(f"{src} carries no vocabulary and {spm} does not exist: export from the run folder")
        vocab = spm.read_bytes()
        ck.meta.setdefault("vocab_sha256", hashlib.sha256(vocab).hexdigest())
    if fmt == "hf":
        return _export_hf(src, ck, vocab, out)
    meta = {k: ck.meta[k] for k in MODEL_META if k in ck.meta}
    meta["exported_from"] = str(src)
    if fmt == "npz":
        save_checkpoint(out, ck.model, meta, vocab=vocab)
    else:
        save_safetensors(out, ck.model, meta, vocab, _linear_weight_names(meta["model_config"]))
    return Path(out)


def _export_hf(src, ck, vocab: bytes, out) -> Path:
    """The Hugging Face Marian folder of a checkpoint (numformer.interop.marian holds the mapping)."""
    from ..interop.marian import export_marian, vocab_of  # noqa: PLC0415

    try:
        cfg = ModelConfig.from_dict(ck.meta["model_config"]).checked()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{src} has an unreadable model config ({exc}): it was written by another "
                              "numformer version or is corrupt") from None
    return export_marian(ck.model, cfg, vocab_of(vocab), out)


def _linear_weight_names(model_config: dict) -> list:
    """The names of the Linear weights of the model ``model_config`` describes (numformer stores them
    (d_in, d_out); a PyTorch reader transposes them)."""
    model = Transformer(ModelConfig.from_dict(model_config).checked(), seed=0)
    names = {n for n, _ in model.named_parameters()}
    linear = {f"{n}.weight" if n else "weight" for n, m in model.named_modules() if isinstance(m, Linear)}
    return sorted(linear & names)
