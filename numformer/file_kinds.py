"""What a path a user gave is, told from its name and its first bytes, and how to print it on one line.

Every command that takes a model or a run folder (``translate.py --model``, ``python -m numformer.checkpoint``,
``train.py --init-from``, ``python -m grad_checks --checkpoint``, ``numformer.attention_maps``, ``numformer.plot``)
asks :func:`kind_of` before it reads, so that a wrong file is answered with what it *is* and what to give
instead ("runs/x/metrics.jsonl is a metrics log, not a model: give a run folder or a .npz model file"), and
"truncated or corrupt" is said only of a numformer model file that is cut or damaged (docs/guarantees.md,
"Files by kind"). A file is never read whole here: a zip's first local header (the name of its first member),
a safetensors header, the first few KiB of anything else.

:func:`shown` prints a user's path: as it is, or quoted with Python's escapes when it holds a control
character (a line break, a tab, an escape), so that every message stays one line.

The ground floor: it imports only :mod:`numformer.errors`, the table of a run folder's file names
(:mod:`numformer.run_file_names`, itself importing nothing of numformer's) and the standard library.
"""
from __future__ import annotations

import json
import struct
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from . import run_file_names
from .errors import NumformerError

# How much of a file is read to tell its kind: enough for a text file's first lines and a zip's first header.
HEAD_BYTES = 4096
# A safetensors header larger than this is not one (real headers are kilobytes; this bounds what is read).
MAX_SAFETENSORS_HEADER = 100 << 20


@dataclass(frozen=True)
class Kind:
    """One kind of path: ``name`` (a stable key) and ``what`` (the phrase a message uses: "a metrics log")."""

    name: str
    what: str


MISSING = Kind("missing", "nothing (no such file or folder)")
RUN_FOLDER = Kind("run folder", "a numformer run folder")
MODEL_FILE = Kind("model file", "a numformer model file")
NUMPY_ARCHIVE = Kind("numpy archive", "a NumPy .npz archive that is not a numformer model")
SENTENCEPIECE = Kind("sentencepiece", "a sentencepiece model (a vocabulary)")
MARIAN_VOCAB = Kind("marian vocabulary", "a Marian vocabulary")
METRICS_LOG = Kind("metrics log", "a metrics log")
RUN_SETTINGS = Kind("run settings", "a run's settings (run.json)")
JSON_FILE = Kind("json", "a JSON file")
HF_FOLDER = Kind("transformers folder", "a Hugging Face transformers model folder")
HF_WEIGHTS = Kind("transformers weights", "a Hugging Face transformers weights file")
CT2_FOLDER = Kind("ctranslate2 folder", "a CTranslate2 model folder")
CT2_WEIGHTS = Kind("ctranslate2 weights", "a CTranslate2 weights file")
PYTORCH = Kind("pytorch", "a PyTorch file")
TEXT = Kind("text", "a text file")
EMPTY = Kind("empty", "an empty file")
FOLDER = Kind("folder", "a folder")
OTHER = Kind("other", "a file of a kind numformer does not read")

#: The kinds a model flag takes (a damaged model file is still one: loading it says it is cut).
MODEL_KINDS = (RUN_FOLDER, MODEL_FILE)
#: The suffixes a numformer model file has; an empty file with one of them is a model file cut at zero bytes.
MODEL_SUFFIXES = (".npz", ".safetensors")
# The weight files a Hugging Face transformers folder holds (save_pretrained: newer safetensors, older a pickle).
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
# The names a zip's first member has in numformer's .npz (np.savez writes the model first, meta last).
NUMFORMER_NPZ_ENTRIES = ("model/", "optim/", "vocab/", "meta.npy")
SENTENCEPIECE_SUFFIXES = (".model",)
METRICS_LOGS = (run_file_names.METRICS, run_file_names.GRAD_STATS)
#: The first bytes of a serialized Marian vocabulary (numformer.data.marian_vocab's format, which takes them from
#: here: this floor tells files apart and may not import the data floor).
MARIAN_VOCAB_MAGIC = b"NFMARIAN"


class FileKindError(NumformerError, ValueError):
    """A path of the wrong kind for the flag it was given to; the message names what it is and what to give."""


def shown(path) -> str:
    """``path`` as a message prints it: as it is, or, when it holds a control character (a line break, a tab,
    an escape, a Unicode line or paragraph separator), quoted with Python's escapes, so that a message stays
    one line and cannot move the terminal's cursor (docs/guarantees.md, "Files by kind")."""
    text = str(path)
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text):
        return repr(text)
    return text


def kind_of(path) -> Kind:
    """What ``path`` is, from its name and its first bytes (never read whole). A file that cannot be opened
    is :data:`OTHER` (reading it later names the reason)."""
    path = Path(path)
    if path.is_dir():
        return _folder_kind(path)
    if not path.exists():
        return MISSING
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return OTHER
    return _file_kind(path, head)


def _folder_kind(path: Path) -> Kind:
    if (path / "model.bin").is_file():  # CTranslate2's converter writes model.bin beside config.json
        return CT2_FOLDER
    if (path / "config.json").is_file() and any((path / n).is_file() for n in HF_WEIGHT_NAMES):
        return HF_FOLDER
    marks = (run_file_names.SETTINGS, run_file_names.CHECKPOINTS, run_file_names.AVERAGED, run_file_names.METRICS)
    if any((path / n).exists() for n in marks):
        return RUN_FOLDER
    return FOLDER


def _file_kind(path: Path, head: bytes) -> Kind:
    name = path.name.lower()
    if not head:
        return EMPTY
    if head.startswith(b"PK"):  # a zip: numpy's .npz or torch.save's archive, told by its first member
        first = _first_zip_member(head)
        if first is not None and (first.endswith("data.pkl") or first.endswith("/version")):
            return PYTORCH
        if first is not None and first.startswith(NUMFORMER_NPZ_ENTRIES):
            return MODEL_FILE
        return NUMPY_ARCHIVE if name.endswith(".npz") else OTHER
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # a pickle: torch.save's legacy format
        return PYTORCH
    if head.startswith(MARIAN_VOCAB_MAGIC):
        return MARIAN_VOCAB
    safetensors = _safetensors_format(path, head)
    if safetensors is not None:
        return MODEL_FILE if safetensors == "numformer" else HF_WEIGHTS
    if _looks_like_sentencepiece(head):
        return SENTENCEPIECE
    if name == "model.bin" or (name.endswith(".bin") and (path.parent / "config.json").is_file()
                               and name not in HF_WEIGHT_NAMES):
        return CT2_WEIGHTS
    if not _is_text(head):
        return OTHER
    first_line = head.split(b"\n", 1)[0].strip()
    if name in METRICS_LOGS or (not name.endswith(".json") and _json_object(first_line, "step")):
        return METRICS_LOG
    if name == run_file_names.SETTINGS:
        return RUN_SETTINGS
    if name.endswith(".json") or head.lstrip().startswith(b"{"):
        return JSON_FILE
    return TEXT


def _first_zip_member(head: bytes) -> str | None:
    """The name in a zip's first local file header (signature PK\\3\\4, name length at byte 26, name at 30)."""
    if not head.startswith(b"PK\x03\x04") or len(head) < 30:
        return None
    (length,) = struct.unpack("<H", head[26:28])
    return head[30:30 + length].decode("utf-8", "replace")


def _safetensors_format(path: Path, head: bytes) -> str | None:
    """A safetensors file starts with its JSON header's length (8 bytes, little-endian), then ``{``. Returns its
    ``__metadata__["format"]`` ("numformer" for numformer's, "" when none), or None when it is not one. A header
    cut short by a truncated file still counts as a safetensors file of its suffix's kind."""
    if len(head) < 9 or head[8:9] != b"{":
        return None
    (size,) = struct.unpack("<Q", head[:8])
    if size > MAX_SAFETENSORS_HEADER:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(8)
            header = json.loads(f.read(size).decode("utf-8"))
    except (OSError, ValueError):
        return "numformer" if path.suffix.lower() == ".safetensors" else ""
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return str((meta or {}).get("format", "")) if isinstance(meta, dict) else ""


def _looks_like_sentencepiece(head: bytes) -> bool:
    """sentencepiece's ModelProto starts with its first piece: field 1 (0x0A) holding a message whose own field 1
    (0x0A) is the piece's text, followed by the score (field 2, a float: 0x15)."""
    try:
        if head[0] != 0x0A:
            return False
        i = _skip_varint(head, 1)
        if head[i] != 0x0A:
            return False
        j = _skip_varint(head, i + 1)
        length, _ = _varint(head, i + 1)
        return head[j + length] == 0x15
    except IndexError:
        return False


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _skip_varint(data: bytes, i: int) -> int:
    return _varint(data, i)[1]


def _is_text(head: bytes) -> bool:
    """No NUL byte, and UTF-8 (the last character may be cut by the read) or almost all printable bytes."""
    if b"\0" in head:
        return False
    for cut in range(4):
        try:
            head[:len(head) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in head)
    return printable >= 0.95 * len(head)


def _json_object(line: bytes, key: str) -> bool:
    try:
        record = json.loads(line.decode("utf-8"))
    except ValueError:
        return False
    return isinstance(record, dict) and key in record


# -- what to say when a path is not what a flag takes -------------------------------------------------------

def not_a_model(path, kind: Kind | None = None) -> str | None:
    """The one line for a path given where a numformer model goes (a run folder or a model file), naming what
    it is and what to give instead; None when it is one (a damaged model file included: loading it says so)."""
    kind = kind_of(path) if kind is None else kind
    p = shown(path)
    if kind in MODEL_KINDS or kind is NUMPY_ARCHIVE:  # an .npz without numformer's entries: the loader names it
        return None
    if kind is EMPTY and str(path).lower().endswith(MODEL_SUFFIXES):
        return None  # a model file cut at zero bytes: the loader calls it truncated
    if kind is MISSING:
        return f"{p} does not exist: check the path or train a model first"
    if kind is HF_FOLDER:
        name = Path(path).name
        return (f"{p} is a Hugging Face model folder, not yet a numformer model: import it once with python -m "
                f"numformer.checkpoint import {p} --out {name}.npz, then give {name}.npz")
    if kind is HF_WEIGHTS or (kind is not MISSING and _folder_kind(Path(path).parent) is HF_FOLDER):
        folder = shown(Path(path).parent)
        return (f"{p} is {kind.what} of a Hugging Face model, not a numformer model: import its folder with python -m "
                f"numformer.checkpoint import {folder} --out model.npz, then give model.npz")
    if kind in (CT2_FOLDER, CT2_WEIGHTS):
        return (f"{p} is {kind.what} (an export, which numformer does not read back), not a numformer model: "
                "give the numformer model file or run folder it was exported from")
    if kind in (SENTENCEPIECE, MARIAN_VOCAB):
        return (f"{p} is {kind.what}, not a model: give a run folder or a .npz model file (a vocabulary goes "
                "to --vocab where a command takes one)")
    if kind is FOLDER:
        return (f"{p} is a folder with no numformer model in it: give a run folder (train.py --out) or a .npz "
                "model file")
    run = Path(path).parent
    beside = f" (the run folder it is in: {shown(run)})" if _folder_kind(run) is RUN_FOLDER else ""
    return f"{p} is {kind.what}, not a model: give a run folder or a .npz model file{beside}"


def require_run_folder(path, flag: str = "RUN") -> Path:
    """``path`` as a run folder (what numformer.plot reads), or a :class:`FileKindError` naming what it is."""
    kind = kind_of(path)
    p = shown(path)
    if kind is RUN_FOLDER:
        return Path(path)
    if kind is MISSING:
        raise FileKindError(f"{flag} {p} does not exist: give the folder train.py --out wrote")
    if kind is METRICS_LOG:
        raise FileKindError(f"{flag} {p} is a metrics log, not a run folder: give the folder it is in, "
                            f"{shown(Path(path).parent)}")
    if kind is FOLDER:
        raise FileKindError(f"{flag} {p} is a folder but not a training run folder (no "
                            f"{run_file_names.METRICS}): give the folder train.py --out wrote")
    raise FileKindError(f"{flag} {p} is {kind.what}, not a run folder: give the folder train.py --out wrote")


def require_input_file(path, flag: str) -> Path:
    """``path`` as a file to read, or a one-line :class:`FileKindError`: a folder is said to be one ("is a folder:
    give a file"), not "no such file"; a missing path is "file not found"."""
    p = Path(path)
    if p.is_dir():
        raise FileKindError(f"{flag} {shown(path)} is a folder: give a file")
    if not p.exists():
        raise FileKindError(f"{flag} {shown(path)}: file not found: check the path")
    return p
