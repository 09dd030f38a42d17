"""Do two checkpoints belong to one model? What :func:`numformer.checkpoint.averaging.average_checkpoints`
asks before it adds their weights.

Averaging is meaningful only between checkpoints of one run: the same vocabulary (the same token behind
each embedding row) and the same model configuration. Tensors of equal shapes do not prove it: two runs with
vocabularies of one size, or with a different number of heads, have the same shapes, and their mean is a
model that translates garbage with exit 0 (issue 59). So the checkpoints' own records are compared, and the
first difference is named in one line.
"""
from __future__ import annotations

import hashlib

from . import CheckpointError

ADVICE = "average checkpoints of one run"


def vocabulary_fingerprint(meta: dict, vocab: bytes | None) -> str | None:
    """The sha256 of a checkpoint's vocabulary: the one its meta records, else that of the vocabulary it
    carries; None when it has neither (an old checkpoint: then the sizes are compared)."""
    if isinstance(meta.get("vocab_sha256"), str):
        return meta["vocab_sha256"]
    return hashlib.sha256(bytes(vocab)).hexdigest() if vocab is not None else None


def first_difference(a: dict, b: dict) -> str | None:
    """The first key on which two model configurations differ, as ``key A vs B``; None when they agree."""
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"{key} {a.get(key, '(absent)')} vs {b.get(key, '(absent)')}"
    return None


def refuse_other_run(first_path, first, path, other) -> None:
    """Raise a one-line :class:`CheckpointError` when the checkpoint ``other`` (read from ``path``) is not of
    the same model as ``first`` (from ``first_path``): another vocabulary (by fingerprint, else by size) or
    another ``model_config``, naming the first difference."""
    names = f"{first_path} and {path}"
    size_a, size_b = first.meta.get("vocab_size"), other.meta.get("vocab_size")
    if size_a is not None and size_b is not None and size_a != size_b:
        raise CheckpointError(f"{names} have different vocabularies: {size_a} vs {size_b} pieces: {ADVICE}")
    sha_a, sha_b = vocabulary_fingerprint(first.meta, first.vocab), vocabulary_fingerprint(other.meta, other.vocab)
    if sha_a is not None and sha_b is not None and sha_a != sha_b:
        raise CheckpointError(f"{names} have different vocabularies (sha256 {sha_a[:12]} vs {sha_b[:12]}): {ADVICE}")
    cfg_a, cfg_b = first.meta.get("model_config"), other.meta.get("model_config")
    if isinstance(cfg_a, dict) and isinstance(cfg_b, dict) and (diff := first_difference(cfg_a, cfg_b)):
        raise CheckpointError(f"{names} have different model configurations: {diff}: {ADVICE}")
