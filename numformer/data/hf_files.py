"""Reading the files of a Hugging Face model folder that a user hands to numformer: every refusal one line.

A Marian folder (``config.json``, ``vocab.json``, ``tokenizer_config.json``, ``source.spm``, ``target.spm``,
``model.safetensors.index.json`` where the weights are sharded) may have been edited by hand, cut short by a
failed copy, or be some other file under the right name. Every read goes through the helpers here, so that
whatever is wrong ends as one :class:`InteropError` line naming the file (and the field), never as a
traceback from deep inside the import:

* :func:`read_json_object`: the file as a JSON object (an empty file, bytes that are not UTF-8 text, malformed
  or truncated JSON, and JSON of another top-level type are each refused, naming the file);
* :func:`field` / :func:`check_value`: one field of it, of a :class:`Kind` (an integer, a number, true or
  false, a string) within a range, with its default when it may be absent;
* :func:`read_sentencepiece`: a sentencepiece model file, its bytes checked by loading them.

The messages end in :data:`FIX`: a file written by ``save_pretrained`` passes, so the remedy is always the
same. The readers sit with the data because the Marian vocabulary (:mod:`numformer.data.marian_vocab`) reads
its tokenizer files through them; the Marian import (:mod:`numformer.interop`) reads the rest.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import NumformerError
from .vocab import sentencepiece_module


class InteropError(NumformerError, ValueError):
    """A model from elsewhere that numformer cannot read or write (or cannot fetch); the message is one line.
    :mod:`numformer.interop` raises it too and exports it."""


#: What every message here ends with: these files are written by transformers, not by hand.
FIX = "fix the file or re-save the model with save_pretrained"
#: :func:`field`'s default for a field the file must hold.
REQUIRED = object()


@dataclass(frozen=True)
class Kind:
    """What a field must hold: ``what`` in words (for the message), ``accepts`` the test of a parsed JSON value."""

    what: str
    accepts: Callable[[object], bool]


# JSON true and false parse to Python's bool, a subclass of int: an integer field must not take them
INTEGER = Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
TOKEN_ID = Kind("an integer token id", INTEGER.accepts)
NUMBER = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
STRING = Kind("a string", lambda v: isinstance(v, str))
OBJECT = Kind("a JSON object {...}", lambda v: isinstance(v, dict))
#: A special token in tokenizer_config.json: its string, or transformers' AddedToken object holding it.
def _token_string(value) -> bool:
    text = value.get("content") if isinstance(value, dict) else value
    return isinstance(text, str) and bool(text)


TOKEN_STRING = Kind('a non-empty token string (or an object whose "content" is one)', _token_string)


def shown(value, limit: int = 60) -> str:
    """A parsed JSON value as the message shows it: Python's repr (``'x'``), JSON's words for null, true and
    false (the file's own spelling), cut to ``limit`` characters."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(
        type(value), "a number")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; InteropError naming it when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InteropError(f"{path} cannot be read ({exc.strerror or type(exc).__name__}): check the file and "
                           "its permissions") from None


def read_json_object(path) -> dict:
    """The JSON object (a dict) in the file ``path``; InteropError naming the file when it cannot be read, is
    empty, is not UTF-8 text, is not JSON (malformed or truncated: where the parser stopped), or holds
    another JSON type than an object."""
    path = Path(path)
    raw = _read_bytes(path)
    if not raw.strip():
        raise InteropError(f"{path} is empty where a JSON object is expected: {FIX}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InteropError(f"{path} is not JSON text (byte {exc.start} is not UTF-8): {FIX}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        short = "; cut short?" if exc.pos >= len(text.rstrip()) else ""  # the parser ran out of text
        raise InteropError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}{short}): "
                           f"{FIX}") from None
    except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting deeper than Python's stack
        raise InteropError(f"{path} is not JSON numformer can read ({type(exc).__name__}): {FIX}") from None
    if not isinstance(data, dict):
        raise InteropError(f"{path} holds {_json_type(data)} where a JSON object {{...}} is expected: {FIX}")
    return data


def _expected(kind: Kind, low, high, below) -> str:
    if low is not None and high is not None:
        return f"{kind.what} from {low} to {high}"
    if low is not None and below is not None:
        return f"{kind.what} in [{low}, {below})"
    if low is not None:
        return f"{kind.what} >= {low}"
    return kind.what


def check_value(value, name: str, kind: Kind, path, low=None, high=None, below=None):
    """``value`` (the field ``name`` of the file ``path``) when it is of ``kind`` and within ``low`` <= value
    <= ``high`` (or < ``below``), each bound where given; else InteropError: the file, the field, what is
    expected, what was found."""
    ok = kind.accepts(value) and (low is None or value >= low) and (high is None or value <= high) and (
        below is None or value < below)
    if not ok:
        raise InteropError(f"{path}: {name} must be {_expected(kind, low, high, below)}, got {shown(value)}: {FIX}")
    return value


def field(config: dict, name: str, kind: Kind, path, default=REQUIRED, low=None, high=None, below=None,
          nullable: bool = False):
    """The field ``name`` of the JSON object ``config`` read from ``path``, checked by :func:`check_value`.
    Absent (or null where ``nullable``): ``default``, unless the field is :data:`REQUIRED`, which is refused
    naming the field and what it must be."""
    if name not in config or (nullable and config[name] is None):
        if default is REQUIRED:
            raise InteropError(f"{path}: {name} is missing; it must be {_expected(kind, low, high, below)}: {FIX}")
        return default
    return check_value(config[name], name, kind, path, low, high, below)


def read_sentencepiece(path) -> bytes:
    """The bytes of the sentencepiece model file ``path``, checked by loading them (an empty file, random bytes,
    a truncated model and another kind of file are refused, naming the file)."""

    path = Path(path)
    data = _read_bytes(path)
    if not data:
        raise InteropError(f"{path} is empty where a sentencepiece model is expected: {FIX}")
    processor = sentencepiece_module().SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except (OSError, RuntimeError, TypeError, ValueError):
        raise InteropError(f"{path} is not a sentencepiece model (damaged, cut short, or another file): "
                           f"{FIX}") from None
    if processor.get_piece_size() < 1:
        raise InteropError(f"{path} is a sentencepiece model without pieces: {FIX}")
    return data


__all__ = ["InteropError", "FIX", "REQUIRED", "Kind", "INTEGER", "TOKEN_ID", "NUMBER", "BOOLEAN", "STRING", "OBJECT",
           "TOKEN_STRING", "shown", "read_json_object", "check_value", "field", "read_sentencepiece"]
