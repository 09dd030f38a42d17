"""Checkpoints: portable ``.npz`` files, written atomically, averaged as in the paper (Section 6.1).

A checkpoint holds host numpy arrays only (a model trained with cupy loads on a
machine without it) and no pickles (``np.load(allow_pickle=False)``):

* ``model/<parameter name>``: the weights (tied weights once);
* ``optim/step``, ``optim/m/<i>``, ``optim/v/<i>``: Adam's state, when saved;
* ``meta``: UTF-8 JSON (model config, training step, RNG and data position, the sha256 of the
  sentencepiece model the run used...);
* ``vocab/spm``: the serialized sentencepiece model itself (uint8), so that one file is a whole
  model: ``translate.py --model model.npz`` needs nothing beside it. Files written before this
  entry existed load as before, with the vocabulary from ``--vocab`` or the run folder.

``export`` writes a model (weights, config, vocabulary; no optimizer state) as ``.npz`` or as
``.safetensors``, the format the field shares weights in (written with the ``safetensors``
package's NumPy API; see :func:`save_safetensors` for its layout); :func:`load_checkpoint`
reads both.

Writes go to a temporary file in the same folder, are flushed and fsynced, then
renamed over the target: a crash at any moment leaves either the old file or
the new one, never half of one.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import NumformerError

_UMASK = os.umask(0)  # read once: mkstemp creates 0600 files, checkpoints get the usual 0666 & ~umask
os.umask(_UMASK)


CHECKPOINT_DIR = "checkpoints"  # RUN/checkpoints/step_0001234.npz: the training checkpoints of a run
AVERAGED = "averaged.npz"       # RUN/averaged.npz: the average of the run's last checkpoints (Section 6.1)
VOCAB_KEY = "vocab/spm"         # the sentencepiece model's bytes inside a checkpoint


def step_checkpoint_path(run_dir, step: int) -> Path:
    """Where a run keeps the checkpoint of optimizer step ``step``."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{int(step):07d}.npz"


def run_checkpoints(run_dir) -> list[Path]:
    """A run's training checkpoints, oldest first (the zero-padded step sorts by name)."""
    return sorted((Path(run_dir) / CHECKPOINT_DIR).glob("step_*.npz"))


class CheckpointError(NumformerError, ValueError):
    """A checkpoint that is missing, truncated, corrupt or does not fit; the message is one line."""


@dataclass
class Checkpoint:
    model: dict                       # name -> numpy array
    meta: dict = field(default_factory=dict)
    optimizer: dict | None = None     # Adam.state_dict() layout
    vocab: bytes | None = None        # the serialized sentencepiece model (None: an older file without it)


def step_of(path) -> int | None:
    """The optimizer step in a training checkpoint's name (``step_0001234.npz`` -> 1234), else None."""
    stem = Path(path).name.split(".")[0]
    return int(stem[5:]) if stem.startswith("step_") and stem[5:].isdigit() else None


def read_meta(path) -> dict:
    """Only the ``meta`` entry of a checkpoint (the weights are not read); a CheckpointError if unreadable."""
    path = Path(path)
    try:
        if _is_safetensors(path):
            return json.loads(_safetensors_metadata(path).get("numformer_meta", "{}"))
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
    except Exception as exc:  # noqa: BLE001  (zip, JSON, missing entry: all mean "cannot tell")
        raise CheckpointError(f"cannot read the metadata of {path} ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is not a numformer checkpoint (its 'meta' entry is not a JSON object)")
    return meta


def newest_model_file(path) -> Path:
    """The model a path names: a file as it is; for a run folder its ``averaged.npz`` if that averages
    the run's newest checkpoint, else the newest checkpoint.

    An average is stale when the run trained on after it was written (``--resume`` after an earlier
    attempt ended): its last source step (``meta["step"]``) is older than the newest checkpoint's,
    and it must not shadow that checkpoint.
    """
    path = Path(path)
    if not path.is_dir():
        return path
    averaged, found = path / AVERAGED, run_checkpoints(path)
    if not found:
        if averaged.is_file():
            return averaged
        raise CheckpointError(f"{path} holds no checkpoint (expected {AVERAGED} or {CHECKPOINT_DIR}/step_*.npz): "
                              "train a model into it first or give a checkpoint file")
    if averaged.is_file():
        newest = step_of(found[-1])
        try:
            step = read_meta(averaged).get("step")
        except CheckpointError:
            return averaged  # a damaged average: loading it says so, in one line
        if isinstance(step, int) and newest is not None:
            fresh = step >= newest
        else:  # no step recorded: the file times decide
            fresh = averaged.stat().st_mtime >= found[-1].stat().st_mtime
        if fresh:
            return averaged
    return found[-1]


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


def save_checkpoint(path, model_state: dict, meta: dict | None = None, optimizer_state: dict | None = None,
                    vocab: bytes | None = None) -> None:
    """Write a checkpoint atomically. model_state: name -> array (e.g. ``model.state_dict()``);
    vocab: the serialized sentencepiece model (``SubwordVocab.to_bytes()``), carried in the file."""
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_state.items()}
    if vocab is not None:
        arrays[VOCAB_KEY] = np.frombuffer(bytes(vocab), dtype=np.uint8)
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
    if _is_safetensors(path):
        return load_safetensors(path)
    vocab = None
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
            if VOCAB_KEY in names:
                vocab = z[VOCAB_KEY].tobytes()
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
    return Checkpoint(model=model, meta=meta, optimizer=optimizer, vocab=vocab)


# -- safetensors -------------------------------------------------------------------------------------------
SAFETENSORS_FORMAT = "numformer"


def _is_safetensors(path) -> bool:
    """A safetensors file starts with its header's length (8 bytes, little-endian) and then ``{``;
    an .npz starts with a zip signature. Decided by content, so a renamed file still loads."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and not head.startswith(b"PK")


def _safetensors():
    try:
        import safetensors.numpy  # noqa: PLC0415  (only for .safetensors files)
    except ImportError:
        raise CheckpointError("reading or writing .safetensors needs the safetensors package: "
                              "run `pip install safetensors`") from None
    return safetensors


def _safetensors_metadata(path) -> dict:
    st = _safetensors()
    with st.safe_open(str(path), framework="numpy") as f:
        return dict(f.metadata() or {})


def save_safetensors(path, model_state: dict, meta: dict, vocab: bytes | None = None,
                     linear_weights=()) -> None:
    """Write a model as safetensors (atomically), through the ``safetensors`` package's NumPy API.

    Tensors: the weights under numformer's parameter names (tied weights once), in numformer's layout,
    host float32. Metadata (strings, as safetensors allows): ``format`` = "numformer";
    ``numformer_meta``: the JSON meta (``model_config`` holds the architecture); ``model_config``:
    that config again on its own; ``spm_model_base64``: the sentencepiece model; ``linear_weights``: a
    JSON list of the Linear weights, which numformer stores as (d_in, d_out) for ``y = x W + b``
    (``torch.nn.Linear`` keeps (d_out, d_in): transpose them when loading into PyTorch).
    """
    st = _safetensors()
    tensors = {k: np.ascontiguousarray(v) for k, v in model_state.items()}
    metadata = {"format": SAFETENSORS_FORMAT, "numformer_meta": json.dumps(meta),
                "model_config": json.dumps(meta.get("model_config", {})),
                "linear_weights": json.dumps(sorted(linear_weights))}
    if vocab is not None:
        metadata["spm_model_base64"] = base64.b64encode(bytes(vocab)).decode("ascii")
    data = st.numpy.save(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(data))


def load_safetensors(path) -> Checkpoint:
    """Read a model written by :func:`save_safetensors`; failures are one-line CheckpointErrors."""
    st = _safetensors()
    path = Path(path)
    try:
        metadata = _safetensors_metadata(path)
        model = st.numpy.load_file(str(path))
        meta = json.loads(metadata.get("numformer_meta", "null"))
        vocab = metadata.get("spm_model_base64")
        vocab = base64.b64decode(vocab, validate=True) if vocab is not None else None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}: check the file and its permissions") from None
    except Exception as exc:  # noqa: BLE001  (SafetensorError, JSON, base64: a damaged file)
        raise CheckpointError(f"safetensors file {path} is truncated or corrupt ({type(exc).__name__}): "
                              "export it again") from None
    if metadata.get("format") != SAFETENSORS_FORMAT or not isinstance(meta, dict):
        raise CheckpointError(f"{path} is a safetensors file but not a numformer model (no numformer metadata): "
                              "export one with python -m numformer.checkpoint export")
    if not model:
        raise CheckpointError(f"{path} holds no model weights")
    return Checkpoint(model=model, meta=meta, vocab=vocab)


def export_model(source, out, fmt: str | None = None) -> Path:
    """Write the model a run folder or checkpoint names (see :func:`newest_model_file`) as one file:
    weights, config and vocabulary, no optimizer state. ``fmt``: "npz" or "safetensors" (default: from
    ``out``'s suffix). The vocabulary is the file's own, else the run folder's ``spm.model``."""
    src = newest_model_file(source)
    fmt = fmt or ("safetensors" if str(out).endswith(".safetensors") else "npz")
    if fmt not in ("npz", "safetensors"):
        raise CheckpointError(f"unknown format {fmt!r}: choose npz or safetensors")
    ck = load_checkpoint(src, with_optimizer=False)
    if "model_config" not in ck.meta:
        raise CheckpointError(f"{src} has no model config in its metadata: not a numformer training checkpoint")
    vocab = ck.vocab
    if vocab is None:
        run_dir = src.parent.parent if src.parent.name == CHECKPOINT_DIR else src.parent
        spm = run_dir / "spm.model"
        if not spm.is_file():
            raise CheckpointError(f"{src} carries no vocabulary and {spm} does not exist: export from the run folder")
        vocab = spm.read_bytes()
        ck.meta.setdefault("vocab_sha256", hashlib.sha256(vocab).hexdigest())
    keep = ("model_config", "vocab_size", "vocab_sha256", "step", "data", "averaged_from")
    meta = {k: ck.meta[k] for k in keep if k in ck.meta}
    meta["exported_from"] = str(src)
    if fmt == "npz":
        save_checkpoint(out, ck.model, meta, vocab=vocab)
    else:
        save_safetensors(out, ck.model, meta, vocab, _linear_weight_names(meta["model_config"]))
    return Path(out)


def _linear_weight_names(model_config: dict) -> list:
    """The names of the Linear weights of the model ``model_config`` describes (stored (d_in, d_out))."""
    from .layers import Linear  # noqa: PLC0415  (the model only when exporting)
    from .model import Transformer  # noqa: PLC0415
    from .presets import ModelConfig  # noqa: PLC0415

    model = Transformer(ModelConfig.from_dict(model_config).validate(), seed=0)
    names = {n for n, _ in model.named_parameters()}
    linear = {f"{n}.weight" if n else "weight" for n, m in model.named_modules() if isinstance(m, Linear)}
    return sorted(linear & names)


def average_checkpoints(paths) -> Checkpoint:
    """The element-wise mean of the weights of several checkpoints (Section 6.1: the base models
    average the last 5 checkpoints, written at 10-minute intervals). Meta comes from the last one;
    no optimizer state. Computed in float64, returned in each tensor's dtype."""
    paths = list(paths)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total, meta, dtypes, vocab = None, {}, {}, None
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
        meta, vocab = ck.meta, ck.vocab
    averaged = {k: (v / len(paths)).astype(dtypes[k]) for k, v in total.items()}
    meta = dict(meta, averaged_from=[str(p) for p in paths])
    return Checkpoint(model=averaged, meta=meta, vocab=vocab)


def main(argv=None) -> int:
    """``python -m numformer.checkpoint average --out OUT.npz CK1.npz CK2.npz ...`` (or ``--last N RUN_DIR``),
    ``python -m numformer.checkpoint export RUN --format safetensors --out model.safetensors``."""
    import argparse  # noqa: PLC0415
    import sys  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m numformer.checkpoint",
                                 description="Average checkpoints (Section 6.1) into one model file, or export a "
                                             "model as one .npz or .safetensors file.")
    sub = ap.add_subparsers(dest="command", required=True)
    avg = sub.add_parser("average", help="average the weights of several checkpoints")
    avg.add_argument("inputs", nargs="+", help="checkpoint files, or one run folder with --last")
    avg.add_argument("--last", type=int, help="average the newest N checkpoints of the run folder given")
    avg.add_argument("--out", required=True, help="file to write (e.g. RUN/averaged.npz)")
    exp = sub.add_parser("export", help="write a model (weights, config, vocabulary) as one file")
    exp.add_argument("source", help="a run folder (its averaged.npz, else newest checkpoint) or a checkpoint")
    exp.add_argument("--format", choices=["npz", "safetensors"], help="default: from --out's suffix")
    exp.add_argument("--out", required=True, help="file to write (model.npz or model.safetensors)")
    args = ap.parse_args(argv)
    try:
        if args.command == "export":
            src = newest_model_file(args.source)
            export_model(src, args.out, args.format)
            print(f"exported {src} to {args.out}")
            return 0
        paths = [Path(p) for p in args.inputs]
        if args.last:
            if len(paths) != 1 or not paths[0].is_dir():
                raise CheckpointError("--last N takes one run folder")
            paths = run_checkpoints(paths[0])[-args.last:]
            if not paths:
                raise CheckpointError(f"no checkpoints in {args.inputs[0]}/checkpoints")
        ck = average_checkpoints(paths)
        save_checkpoint(args.out, ck.model, ck.meta, vocab=ck.vocab)
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
