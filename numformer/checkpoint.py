"""Checkpoints: portable ``.npz`` files, written atomically, averaged as in the paper (Section 6.1).

A checkpoint holds host numpy arrays only (a model trained with cupy loads on a
machine without it) and no pickles (``np.load(allow_pickle=False)``):

* ``model/<parameter name>``: the weights (tied weights once);
* ``optim/step``, ``optim/m/<i>``, ``optim/v/<i>``: Adam's state, when saved;
* ``meta``: UTF-8 JSON (model config, training step, RNG and data position, the sha256 of the
  sentencepiece model the run used...).

Writes go to a temporary file in the same folder, are flushed and fsynced, then
renamed over the target: a crash at any moment leaves either the old file or
the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_UMASK = os.umask(0)  # read once: mkstemp creates 0600 files, checkpoints get the usual 0666 & ~umask
os.umask(_UMASK)


CHECKPOINT_DIR = "checkpoints"  # RUN/checkpoints/step_0001234.npz: the training checkpoints of a run


def step_checkpoint_path(run_dir, step: int) -> Path:
    """Where a run keeps the checkpoint of optimizer step ``step``."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{int(step):07d}.npz"


def run_checkpoints(run_dir) -> list[Path]:
    """A run's training checkpoints, oldest first (the zero-padded step sorts by name)."""
    return sorted((Path(run_dir) / CHECKPOINT_DIR).glob("step_*.npz"))


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupt or does not fit; the message is one line."""


@dataclass
class Checkpoint:
    model: dict                       # name -> numpy array
    meta: dict = field(default_factory=dict)
    optimizer: dict | None = None     # Adam.state_dict() layout


def vocab_fingerprint(vocab) -> str:
    """sha256 of a vocabulary's serialized sentencepiece model; training checkpoints record it in
    ``meta["vocab_sha256"]`` so that loading with another vocabulary fails instead of translating garbage."""
    return hashlib.sha256(vocab.to_bytes()).hexdigest()


def remove_stale_temporaries(folder) -> list:
    """Delete the temporary files a killed :func:`atomic_write` left in ``folder``; returns their paths."""
    gone = []
    for tmp in Path(folder).glob(".*.tmp"):
        try:
            tmp.unlink()
            gone.append(tmp)
        except OSError:
            pass
    return gone


def atomic_write(path, write) -> None:
    """Call ``write(file_object)`` on a temporary file beside ``path``, fsync it, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def save_checkpoint(path, model_state: dict, meta: dict | None = None, optimizer_state: dict | None = None) -> None:
    """Write a checkpoint atomically. model_state: name -> array (e.g. ``model.state_dict()``)."""
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_state.items()}
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
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: check the path or train a model first")
    try:
        with np.load(path, allow_pickle=False) as z:
            names = list(z.files)
            if "meta" not in names:
                raise CheckpointError(f"{path} is not a numformer checkpoint (no 'meta' entry)")
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            model = {k[len("model/"):]: z[k] for k in names if k.startswith("model/")}
            optimizer = None
            if with_optimizer and "optim/step" in names:
                n = sum(1 for k in names if k.startswith("optim/m/"))
                optimizer = {"step_count": int(z["optim/step"]),
                             "m": [z[f"optim/m/{i}"] for i in range(n)],
                             "v": [z[f"optim/v/{i}"] for i in range(n)]}
    except CheckpointError:
        raise
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error, not numpy's "not an npz file"
            raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}: check the file and its "
                                  "permissions") from None
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(exc).__name__}): "
                              "use an earlier checkpoint from the same folder") from None
    except Exception as exc:  # a damaged file fails in many ways: zip, CRC, npy header, JSON, MemoryError
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(exc).__name__}): "
                              "use an earlier checkpoint from the same folder") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is not a numformer checkpoint (its 'meta' entry is not a JSON object)")
    if not model:
        raise CheckpointError(f"{path} holds no model weights")
    return Checkpoint(model=model, meta=meta, optimizer=optimizer)


def average_checkpoints(paths) -> Checkpoint:
    """The element-wise mean of the weights of several checkpoints (Section 6.1: the base models
    average the last 5 checkpoints, written at 10-minute intervals). Meta comes from the last one;
    no optimizer state. Computed in float64, returned in each tensor's dtype."""
    paths = list(paths)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total, meta, dtypes = None, {}, {}
    for p in paths:
        ck = load_checkpoint(p, with_optimizer=False)
        if total is None:
            total = {k: v.astype(np.float64) for k, v in ck.model.items()}
            dtypes = {k: v.dtype for k, v in ck.model.items()}
        else:
            if set(ck.model) != set(total) or any(ck.model[k].shape != total[k].shape for k in total):
                raise CheckpointError(f"{p} does not have the same tensors as {paths[0]}: cannot average them")
            for k in total:
                total[k] += ck.model[k]
        meta = ck.meta
    averaged = {k: (v / len(paths)).astype(dtypes[k]) for k, v in total.items()}
    meta = dict(meta, averaged_from=[str(p) for p in paths])
    return Checkpoint(model=averaged, meta=meta)


def main(argv=None) -> int:
    """``python -m numformer.checkpoint average --out OUT.npz CK1.npz CK2.npz ...`` or ``--last N RUN_DIR``."""
    import argparse  # noqa: PLC0415
    import sys  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m numformer.checkpoint",
                                 description="Average checkpoints (Section 6.1) into one model file.")
    sub = ap.add_subparsers(dest="command", required=True)
    avg = sub.add_parser("average", help="average the weights of several checkpoints")
    avg.add_argument("inputs", nargs="+", help="checkpoint files, or one run folder with --last")
    avg.add_argument("--last", type=int, help="average the newest N checkpoints of the run folder given")
    avg.add_argument("--out", required=True, help="file to write (e.g. RUN/averaged.npz)")
    args = ap.parse_args(argv)
    try:
        paths = [Path(p) for p in args.inputs]
        if args.last:
            if len(paths) != 1 or not paths[0].is_dir():
                raise CheckpointError("--last N takes one run folder")
            paths = run_checkpoints(paths[0])[-args.last:]
            if not paths:
                raise CheckpointError(f"no checkpoints in {args.inputs[0]}/checkpoints")
        ck = average_checkpoints(paths)
        save_checkpoint(args.out, ck.model, ck.meta)
    except CheckpointError as exc:
        print(f"numformer.checkpoint: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"numformer.checkpoint: error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
