"""What train.py and translate.py share: one-line errors, argument checks, loading a trained model from a run.

Every mistake a user can make on the command line ends the same way: one line
``prog: error: what is wrong: what to do`` on stderr, a non-zero exit status
(2 for bad input, 3 when training had to stop, 130 after Ctrl-C) and no
traceback. Only errors raised on purpose for bad input are such one-liners
(:data:`USER_ERRORS`); anything else is a bug in numformer: one line says so and
names the file its traceback was written to, exit status 1. ``NUMFORMER_DEBUG=1``
shows the traceback instead in both cases.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..backend import BackendError, resolve_device, xp_for
from ..checkpoint import CheckpointError, load_checkpoint, newest_model_file, vocab_fingerprint
from ..data import DataError, SubwordVocab
from ..training.distributed import DistributedError
from ..errors import StopTraining, UsageError
from ..model import Transformer
from ..precision import PrecisionError
from ..presets import ModelConfig

# Errors raised on purpose for bad input or a run that had to stop: one line, no traceback. Not ValueError
# or OSError at large: a shape mismatch inside numformer is a ValueError too, and it is a bug.
USER_ERRORS = (UsageError, BackendError, CheckpointError, DataError, PrecisionError, DistributedError, StopTraining)
# An OSError that says the machine, not the program, is at fault (a full disk, a read-only file system):
# one line as well. Any other OSError that escapes was not expected where it happened: a bug.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
BUG_EXIT = 1  # a bug in numformer (2: bad input, 3: training stopped, 130: interrupted)


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


def write_crash_log(prog: str, exc: BaseException, folder=None) -> Path | None:
    """Write ``exc``'s traceback to ``folder/crash.log`` (a run folder), else to a new temporary file;
    returns the path (None when nothing could be written). Never raises: a crash report must not hide
    the crash."""
    text = (f"{prog} crashed at {time.strftime('%Y-%m-%d %H:%M:%S')}\ncommand: {' '.join(sys.argv)}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    if folder is not None:
        try:
            path = Path(folder) / "crash.log"
            if path.parent.is_dir():
                path.write_text(text, encoding="utf-8")
                return path
        except OSError:
            pass
    try:
        fd, name = tempfile.mkstemp(prefix=f"numformer-{Path(prog).stem}-crash-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return Path(name)


@contextmanager
def one_line_errors(prog: str, crash_folder=None):
    """Turn a user mistake into ``prog: error: message`` on stderr, no traceback.

    Exit status 2 for bad input (:data:`USER_ERRORS`, and an OSError of a full disk or a read-only file
    system), the exception's ``exit_code`` when it has one (3: training stopped), 130 for Ctrl-C.
    Anything else is a bug: one line says so and where its traceback was written
    (``crash_folder()/crash.log`` when that callable names an existing folder, else a temporary
    file), exit status 1.
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
    except OSError as exc:
        if debug:
            raise
        if exc.errno in ENVIRONMENT_ERRNOS:
            print(f"{prog}: error: {error_line(exc)}: free space or choose another place, then run again",
                  file=sys.stderr)
            sys.exit(2)
        _bug(prog, exc, crash_folder)
    except Exception as exc:  # noqa: BLE001  (not a user error: a bug, reported as one)
        if debug:
            raise
        _bug(prog, exc, crash_folder)


def _bug(prog: str, exc: BaseException, crash_folder) -> None:
    folder = None
    try:
        folder = crash_folder() if crash_folder is not None else None
    except Exception:  # noqa: BLE001
        pass
    path = write_crash_log(prog, exc, folder)
    if path is None:  # nowhere to write it: the traceback itself, here
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    print(f"{prog}: internal error (a bug in numformer, not in your input): {type(exc).__name__}: "
          f"{error_line(exc)}; " + (f"the traceback is in {path}: please report it with that file" if path else
                                    "please report it with the traceback above"), file=sys.stderr)
    sys.exit(BUG_EXIT)


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
    """(model in eval mode on ``device``, vocab, model file path) from a model file or a run folder.

    The vocabulary: ``vocab_path`` when given; else the sentencepiece model the file carries (every
    checkpoint and exported model written since vocabularies were embedded: one file is a whole
    model); else ``spm.model`` beside the run (older checkpoints). It must be the one the model was
    trained with (size, and sha256 when the file recorded it).
    """
    path = newest_model_file(checkpoint)  # a run folder: its fresh average, else its newest checkpoint
    ck = load_checkpoint(path, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{path} has no model config in its metadata: not a numformer training checkpoint")
    try:
        cfg = ModelConfig.from_dict(ck.meta["model_config"])
        cfg.validate()
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} has an unreadable model config ({error_line(exc)}): "
                              "it was written by another numformer version or is corrupt") from None
    if vocab_path is None and ck.vocab is not None:
        try:
            vocab = SubwordVocab.from_bytes(ck.vocab)
        except Exception:  # noqa: BLE001  (sentencepiece's parse errors have no common class)
            raise CheckpointError(f"{path} carries an unreadable vocabulary: it is corrupt; pass --vocab PATH to "
                                  "the run's spm.model or use another checkpoint") from None
        check_vocab(vocab, ck.meta, "(the one in the file)", f"checkpoint {path}")
    else:
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
