"""What train.py and translate.py share: one-line errors, argument checks, loading a trained model from a run.

Every mistake a user can make on the command line ends the same way: one line
``prog: error: what is wrong: what to do`` on stderr, a non-zero exit status
(2 for bad input, 3 when training had to stop, 130 after Ctrl-C) and no
traceback. ``NUMFORMER_DEBUG=1`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .backend import BackendError, resolve_device, xp_for
from .checkpoint import CheckpointError, load_checkpoint, run_checkpoints, vocab_fingerprint
from .data import DataError, SubwordVocab
from .model import Transformer
from .presets import ModelConfig
from .trainer import StopTraining

USER_ERRORS = (BackendError, CheckpointError, DataError, StopTraining, ValueError, OSError)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ... (see prog --help)``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _checked(kind, test, words):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or not test(value):  # NaN fails every test
            raise argparse.ArgumentTypeError(f"must be {words}, got {text}")
        return value
    parse.__name__ = words
    return parse


positive_int = _checked(int, lambda v: v >= 1, "at least 1")
nonneg_int = _checked(int, lambda v: v >= 0, "at least 0")
positive_float = _checked(float, lambda v: 0 < v < float("inf"), "a positive number")
nonneg_float = _checked(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
probability = _checked(float, lambda v: 0 <= v < 1, "in [0, 1)")


def error_line(exc: BaseException) -> str:
    """The first line of an exception's message (OSError: 'file: reason')."""
    if isinstance(exc, OSError) and not isinstance(exc, (DataError, CheckpointError)) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{where}: {exc.strerror}" if where else exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def one_line_errors(prog: str):
    """Turn a user mistake into ``prog: error: message`` on stderr, no traceback.

    Exit status 2 for bad input, the exception's ``exit_code`` when it has one
    (3: training stopped), 130 for Ctrl-C. Bugs (any other exception) keep their traceback.
    """
    debug = os.environ.get("NUMFORMER_DEBUG", "") not in ("", "0")
    try:
        yield
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"{prog}: error: {error_line(exc)}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))


def find_checkpoint(path) -> Path:
    """A checkpoint file, or a run folder (-> averaged.npz if present, else its newest checkpoint)."""
    path = Path(path)
    if path.is_dir():
        if (path / "averaged.npz").is_file():
            return path / "averaged.npz"
        found = run_checkpoints(path)
        if not found:
            raise CheckpointError(f"{path} holds no checkpoint (expected averaged.npz or checkpoints/step_*.npz): "
                                  "train a model into it first or give a checkpoint file")
        return found[-1]
    return path


def check_vocab(vocab, meta: dict, vocab_path, what) -> None:
    """The vocabulary must be the one the model was trained with: same size, and the same file when the
    checkpoint recorded its fingerprint (checkpoints written before fingerprints only have the size)."""
    cfg_size = meta.get("model_config", {}).get("vocab_size")
    if cfg_size is not None and vocab.size != cfg_size:
        raise DataError(f"vocabulary {vocab_path} has {vocab.size} pieces but {what} expects {cfg_size}: "
                        "use the spm.model of the same run")
    expected = meta.get("vocab_sha256")
    if expected and vocab_fingerprint(vocab) != expected:
        raise DataError(f"vocabulary {vocab_path} is not the one {what} was trained with (its sha256 differs): "
                        "use the spm.model of the same run")


def load_model(checkpoint, vocab_path=None, device: str | None = None):
    """(model in eval mode on ``device``, vocab, checkpoint path) from a checkpoint or run folder.

    The vocabulary is ``spm.model`` beside the run unless given; it must be the one the
    checkpoint was trained with (size, and sha256 when the checkpoint recorded it).
    """
    path = find_checkpoint(checkpoint)
    ck = load_checkpoint(path, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{path} has no model config in its metadata: not a numformer training checkpoint")
    try:
        cfg = ModelConfig.from_dict(ck.meta["model_config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} has an unreadable model config ({error_line(exc)}): "
                              "it was written by another numformer version or is corrupt") from None
    if vocab_path is None:
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        vocab_path = run_dir / "spm.model"
    vocab_path = Path(vocab_path)
    if not vocab_path.is_file():
        raise DataError(f"vocabulary {vocab_path} not found: pass --vocab PATH to the run's spm.model")
    vocab = SubwordVocab.load(vocab_path)
    check_vocab(vocab, ck.meta, vocab_path, f"checkpoint {path}")
    xp = xp_for(resolve_device(device))
    model = Transformer(cfg, seed=0, dtype=np.float32)
    try:
        model.load_state_dict(ck.model)
    except ValueError as exc:
        raise CheckpointError(f"{path} does not fit its own config ({error_line(exc)}): it is corrupt, "
                              "use another checkpoint of the run") from None
    model.to(xp)
    return model.eval(), vocab, path
