"""What train.py and translate.py share: one-line errors and loading a trained model from a run."""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .backend import BackendError, resolve_device, xp_for
from .checkpoint import CheckpointError, load_checkpoint
from .data import DataError, SubwordVocab
from .model import Transformer
from .presets import ModelConfig

USER_ERRORS = (BackendError, CheckpointError, DataError, ValueError, FileNotFoundError, PermissionError)


@contextmanager
def one_line_errors(prog: str):
    """Turn a user mistake into ``prog: error: message`` on stderr and exit status 2, no traceback."""
    try:
        yield
    except USER_ERRORS as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        sys.exit(2)


def find_checkpoint(path) -> Path:
    """A checkpoint file, or a run folder (-> averaged.npz if present, else its newest checkpoint)."""
    path = Path(path)
    if path.is_dir():
        if (path / "averaged.npz").is_file():
            return path / "averaged.npz"
        found = sorted((path / "checkpoints").glob("step_*.npz"))
        if not found:
            raise CheckpointError(f"{path} holds no checkpoint (expected averaged.npz or checkpoints/step_*.npz)")
        return found[-1]
    return path


def load_model(checkpoint, vocab_path=None, device: str | None = None):
    """(model in eval mode on ``device``, vocab, checkpoint path) from a checkpoint or run folder.

    The vocabulary is ``spm.model`` beside the run unless given; its size must match the model's.
    """
    path = find_checkpoint(checkpoint)
    ck = load_checkpoint(path, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{path} has no model config in its metadata: not a numformer training checkpoint")
    cfg = ModelConfig.from_dict(ck.meta["model_config"])
    if vocab_path is None:
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        vocab_path = run_dir / "spm.model"
    vocab_path = Path(vocab_path)
    if not vocab_path.is_file():
        raise DataError(f"vocabulary {vocab_path} not found: pass --vocab PATH to the run's spm.model")
    vocab = SubwordVocab.load(vocab_path)
    if vocab.size != cfg.vocab_size:
        raise DataError(f"vocabulary {vocab_path} has {vocab.size} pieces but the checkpoint expects "
                        f"{cfg.vocab_size}: use the spm.model of the same run")
    xp = xp_for(resolve_device(device))
    model = Transformer(cfg, seed=0, dtype=np.float32)
    try:
        model.load_state_dict(ck.model)
    except ValueError as exc:
        raise CheckpointError(f"{path} does not fit its own config: {exc}") from None
    model.to(xp)
    return model.eval(), vocab, path
