"""A Marian (opus-mt) vocabulary: two sentencepiece models and one joint id map.

A Hugging Face Marian model (``MarianMTModel``, the Helsinki-NLP opus-mt family) splits text with
two sentencepiece models, ``source.spm`` for source lines and ``target.spm`` for target lines, and
turns the pieces into the model's ids through one joint map, ``vocab.json`` (piece -> id): the
sentencepiece ids are *not* the model's ids. The special ids come from the model's config: eos
``</s>`` (usually 0), unk ``<unk>`` (1), pad ``<pad>`` (usually the last id, V - 1), and the decoder
starts from ``decoder_start_token_id`` (the pad id), which is this vocabulary's ``bos_id``.

:class:`MarianVocab` stands wherever numformer uses its shared :class:`~numformer.data.vocab.SubwordVocab`
(translation, the model file, the prepared corpus): the same attributes (``size``, ``pad_id``,
``unk_id``, ``bos_id``, ``eos_id``), ``encode_source`` / ``encode_target`` for the two sides (``encode``
is ``encode_source``), ``decode`` for target ids, and ``to_bytes`` / ``from_bytes`` so the model file
carries it (``vocab/marian`` in a checkpoint: one blob holding both sentencepiece models and the map).

Text to ids is what transformers' ``MarianTokenizer`` does (``models/marian/tokenization_marian.py``):

* the special tokens' strings (``</s>``, ``<unk>``, ``<pad>``) written in the text are tokens of their
  own: the text is split around them (the tokenizer's trie of added tokens) and each other segment
  is encoded alone;
* a segment that starts with a language code ``>>xx<<`` gives the code as one token, looked up in the
  map, then the rest of the segment;
* each segment goes through the side's sentencepiece model as piece *strings* (its own
  normalisation applies); a piece missing from ``vocab.json`` becomes ``unk_id``; no punctuation
  normalisation (``MarianTokenizer.normalize`` is not called when encoding);
* no eos is added here: numformer's batching appends it, as the tokenizer does.

Ids to text is ``MarianTokenizer.batch_decode(ids, skip_special_tokens=True)`` with its default
``clean_up_tokenization_spaces=False``: a sequence is cut at its first eos, every special id (pad,
eos, unk, the decoder start) is dropped (so an ``<unk>`` leaves nothing, where SubwordVocab writes
`` ⁇ ``), the pieces are joined by the target sentencepiece model, ``▁`` becomes a space and the ends
are stripped. (transformers decodes with the *source* model when the vocabulary is shared, a quirk of
``MarianTokenizer._decode``; both models decode ordinary pieces alike, and the target model is the one
that describes target text.)
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Sequence

from ..file_kinds import MARIAN_VOCAB_MAGIC
from .errors import DataError
from .hf_files import (BOOLEAN, FIX, INTEGER, STRING, TOKEN_STRING, InteropError, check_value, field,
                       read_json_object, read_sentencepiece)
from .vocab import cut_at_eos, sentencepiece_module

#: The first bytes of a serialized MarianVocab (a sentencepiece model starts with a protobuf tag instead); one
#: definition, in numformer.file_kinds, which tells a file of this format by them.
MAGIC = MARIAN_VOCAB_MAGIC
#: The serialized format's version.
FORMAT = 1
#: The special tokens' strings MarianTokenizer uses unless its tokenizer_config.json names others.
DEFAULT_TOKENS = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
#: The tokenizer files of a Marian model folder.
SOURCE_SPM, TARGET_SPM, VOCAB_JSON, TOKENIZER_CONFIG = "source.spm", "target.spm", "vocab.json", "tokenizer_config.json"


def is_marian_vocab_bytes(data) -> bool:
    """Does a serialized vocabulary (a checkpoint's blob) hold a MarianVocab (else a sentencepiece model)?"""
    return bytes(data[: len(MAGIC)]) == MAGIC


def vocab_from_bytes(data: bytes):
    """The vocabulary a model file carries: a :class:`MarianVocab` or a
    :class:`~numformer.data.vocab.SubwordVocab`, told apart by the blob's first bytes."""
    if is_marian_vocab_bytes(data):
        return MarianVocab.from_bytes(data)
    from .vocab import SubwordVocab  # noqa: PLC0415

    return SubwordVocab.from_bytes(data)


def load_vocab_file(path):
    """A run's vocabulary file (:func:`numformer.run_file_names.run_vocab`): a Marian blob or a sentencepiece model."""
    from .vocab import SubwordVocab  # noqa: PLC0415

    path = Path(path)
    with open(path, "rb") as f:
        marian = is_marian_vocab_bytes(f.read(len(MAGIC)))
    return MarianVocab.from_bytes(path.read_bytes()) if marian else SubwordVocab.load(path)


def _processor(proto: bytes, what: str):
    spm = sentencepiece_module()
    processor = spm.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(bytes(proto))
    except (OSError, RuntimeError, TypeError):
        raise DataError(f"{what} is not a sentencepiece model") from None
    return processor


class MarianVocab:
    """Two sentencepiece models (source, target) and the joint piece -> id map of a Marian model.

    Args:
        source_proto, target_proto: the serialized ``source.spm`` and ``target.spm``.
        pieces: ``vocab.json``: piece -> model id.
        eos_id, pad_id: the model config's ``eos_token_id`` and ``pad_token_id``.
        bos_id: the decoder's start token (``decoder_start_token_id``; default ``pad_id``).
        size: the model's vocabulary size (its embedding rows; default: one more than the largest id).
        tokens: the special tokens' strings, ``{"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}`` by default.
        source_lang, target_lang: as tokenizer_config.json names them (kept for the export; may be None).
    Attributes:
        size, pad_id, unk_id, bos_id, eos_id: as :class:`~numformer.data.vocab.SubwordVocab`'s.
        requested_size: equal to ``size``; path: None (a MarianVocab is not one file).
    Raises:
        DataError (one line): a special token missing from the map, an id outside ``size``, or special
        ids that disagree with the map.
    """

    kind = "marian"

    def __init__(self, source_proto: bytes, target_proto: bytes, pieces: dict, eos_id: int, pad_id: int,
                 bos_id: int | None = None, size: int | None = None, tokens: dict | None = None,
                 source_lang: str | None = None, target_lang: str | None = None):
        self._source_proto, self._target_proto = bytes(source_proto), bytes(target_proto)
        self._source = _processor(self._source_proto, "source.spm")
        self._target = _processor(self._target_proto, "target.spm")
        if not isinstance(pieces, dict) or not pieces:
            raise DataError("vocab.json must be a non-empty JSON object (piece -> id)")
        bad = [p for p, i in pieces.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0]
        if bad:
            raise DataError(f"vocab.json maps {bad[0]!r} to {pieces[bad[0]]!r}: ids must be non-negative integers")
        self._pieces = dict(pieces)
        self.tokens = dict(DEFAULT_TOKENS, **(tokens or {}))
        self.source_lang, self.target_lang = source_lang, target_lang
        self.size = int(size) if size is not None else max(self._pieces.values()) + 1
        self.requested_size = self.size
        self.path = None
        largest = max(self._pieces.values())
        if largest >= self.size:
            raise DataError(f"vocab.json has id {largest} but the model has {self.size} vocabulary rows")
        for role in ("unk", "eos", "pad"):
            if self.tokens[role] not in self._pieces:
                raise DataError(f"vocab.json has no {role} token {self.tokens[role]!r}")
        self.unk_id = self._pieces[self.tokens["unk"]]
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.bos_id = self.pad_id if bos_id is None else int(bos_id)
        for role, given in (("eos", self.eos_id), ("pad", self.pad_id)):
            if self._pieces[self.tokens[role]] != given:
                raise DataError(f"the model's {role} id is {given} but vocab.json gives {self.tokens[role]!r} "
                                f"the id {self._pieces[self.tokens[role]]}: the tokenizer files are not this model's")
        if not 0 <= self.bos_id < self.size:
            raise DataError(f"the decoder start id {self.bos_id} is not an id of the {self.size}-row vocabulary")
        self._id_to_piece = {i: p for p, i in self._pieces.items()}  # MarianTokenizer's inverse map
        self._special_strings = sorted({self.tokens[r] for r in ("eos", "unk", "pad")}, key=len, reverse=True)
        self._special_ids = {self.eos_id, self.pad_id, self.unk_id, self.bos_id}

    # ------------------------------------------------------------------ files
    @classmethod
    def from_files(cls, folder, eos_id: int, pad_id: int, bos_id: int | None = None,
                   size: int | None = None) -> "MarianVocab":
        """Read ``source.spm``, ``target.spm``, ``vocab.json`` (and ``tokenizer_config.json`` when there)
        from a Marian model folder (``MarianTokenizer.save_pretrained``'s files). They are a user's files:
        each is read through :mod:`numformer.data.hf_files`, so that an empty, truncated or foreign file and
        a field of the wrong type are one InteropError line naming the file (and the field)."""

        folder = Path(folder)
        missing = [n for n in (SOURCE_SPM, TARGET_SPM, VOCAB_JSON) if not (folder / n).is_file()]
        if missing:
            raise DataError(f"{folder} lacks the Marian tokenizer file{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}: save the tokenizer with MarianTokenizer.save_pretrained")
        vocab_path = folder / VOCAB_JSON
        pieces = read_json_object(vocab_path)
        if not pieces:
            raise InteropError(f"{vocab_path} holds no pieces (an empty JSON object): {FIX}")
        for piece, i in pieces.items():
            check_value(i, f"the id of {piece!r}", INTEGER, vocab_path, low=0)
        tokens, langs = {}, (None, None)
        config_path = folder / TOKENIZER_CONFIG
        if config_path.is_file():
            tc = read_json_object(config_path)
            if field(tc, "separate_vocabs", BOOLEAN, config_path, default=False, nullable=True):
                raise DataError(f"{config_path} asks for separate source and target vocabularies "
                                "(separate_vocabs): numformer's Marian vocabulary is one joint map")
            for role, default in DEFAULT_TOKENS.items():
                value = field(tc, f"{role}_token", TOKEN_STRING, config_path, default=default, nullable=True)
                tokens[role] = value["content"] if isinstance(value, dict) else value  # AddedToken's content
            langs = tuple(field(tc, key, STRING, config_path, default=None, nullable=True)
                          for key in ("source_lang", "target_lang"))
        protos = [read_sentencepiece(folder / name) for name in (SOURCE_SPM, TARGET_SPM)]
        return cls(protos[0], protos[1], pieces, eos_id, pad_id, bos_id, size, tokens, *langs)

    def save_files(self, folder) -> list[Path]:
        """Write ``source.spm``, ``target.spm`` and ``vocab.json`` into ``folder`` (MarianTokenizer reads them)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SOURCE_SPM).write_bytes(self._source_proto)
        (folder / TARGET_SPM).write_bytes(self._target_proto)
        (folder / VOCAB_JSON).write_text(json.dumps(self._pieces, ensure_ascii=False, indent=2), encoding="utf-8")
        return [folder / SOURCE_SPM, folder / TARGET_SPM, folder / VOCAB_JSON]

    def to_bytes(self) -> bytes:
        """One blob (what a model file carries as ``vocab/marian``): ``MAGIC``, the header's length
        (8 bytes, little-endian), the header (UTF-8 JSON: format, ids, size, tokens, languages, the
        map and the two models' lengths), then ``source.spm`` and ``target.spm``. Deterministic."""
        header = {"format": FORMAT, "size": self.size, "eos_id": self.eos_id, "pad_id": self.pad_id,
                  "bos_id": self.bos_id, "tokens": self.tokens, "source_lang": self.source_lang,
                  "target_lang": self.target_lang, "source_spm": len(self._source_proto),
                  "target_spm": len(self._target_proto), "pieces": self._pieces}
        head = json.dumps(header, ensure_ascii=False).encode("utf-8")
        return MAGIC + struct.pack("<Q", len(head)) + head + self._source_proto + self._target_proto

    @classmethod
    def from_bytes(cls, data: bytes) -> "MarianVocab":
        """Inverse of :meth:`to_bytes`; a DataError (one line) when the blob is not one."""
        data = bytes(data)
        if not is_marian_vocab_bytes(data) or len(data) < len(MAGIC) + 8:
            raise DataError("not a serialized Marian vocabulary")
        (n,) = struct.unpack("<Q", data[len(MAGIC): len(MAGIC) + 8])
        start = len(MAGIC) + 8
        try:
            header = json.loads(data[start: start + n].decode("utf-8"))
            body = start + n
            src = data[body: body + header["source_spm"]]
            tgt = data[body + header["source_spm"]: body + header["source_spm"] + header["target_spm"]]
            if header.get("format") != FORMAT or header["source_spm"] + header["target_spm"] != len(data) - body:
                raise ValueError("bad lengths or format")
            return cls(src, tgt, header["pieces"], header["eos_id"], header["pad_id"], header["bos_id"],
                       header["size"], header["tokens"], header.get("source_lang"), header.get("target_lang"))
        except DataError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise DataError(f"the serialized Marian vocabulary is damaged ({type(exc).__name__})") from None

    # ------------------------------------------------------------------- use
    def __len__(self) -> int:
        return self.size

    @property
    def pieces(self) -> dict:
        """A copy of the joint map (``vocab.json``): piece -> id."""
        return dict(self._pieces)

    def _split_special(self, text: str) -> list:
        """Segments of ``text`` split around the special tokens' strings: (segment, is_special) pairs."""
        out, start, i = [], 0, 0
        while i < len(text):
            for tok in self._special_strings:
                if text.startswith(tok, i):
                    if i > start:
                        out.append((text[start:i], False))
                    out.append((tok, True))
                    i += len(tok)
                    start = i
                    break
            else:
                i += 1
        if start < len(text):
            out.append((text[start:], False))
        return out

    def _ids(self, pieces) -> list[int]:
        get, unk = self._pieces.get, self.unk_id
        return [get(p, unk) for p in pieces]

    def _encode_line(self, text: str, sp) -> list[int]:
        ids = []
        for segment, special in self._split_special(text):
            if special:
                ids.append(self._pieces[segment])
                continue
            if segment.startswith(">>") and (end := segment.find("<<")) != -1:   # a language code
                ids.append(self._pieces.get(segment[: end + 2], self.unk_id))
                segment = segment[end + 2:]
            ids.extend(self._ids(sp.encode(segment, out_type=str)))
        return ids

    def _encode(self, lines: Sequence[str], sp, num_threads: int | None) -> list[list[int]]:
        if isinstance(lines, str):
            raise TypeError("encode takes a list of lines, not one string")
        lines = list(lines)
        plain = [i for i, line in enumerate(lines)
                 if not line.startswith(">>") and not any(tok in line for tok in self._special_strings)]
        out: list = [None] * len(lines)
        if plain:
            kw = {} if num_threads is None else {"num_threads": int(num_threads)}
            for i, pieces in zip(plain, sp.encode([lines[i] for i in plain], out_type=str, **kw)):
                out[i] = self._ids(pieces)
        for i, line in enumerate(lines):
            if out[i] is None:
                out[i] = self._encode_line(line, sp)
        return out

    def encode_source(self, lines: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Source lines -> lists of model ids through ``source.spm`` and the joint map; no eos added."""
        return self._encode(lines, self._source, num_threads)

    def encode_target(self, lines: Sequence[str], num_threads: int | None = None) -> list[list[int]]:
        """Target lines -> lists of model ids through ``target.spm`` and the joint map; no eos added."""
        return self._encode(lines, self._target, num_threads)

    #: Where a caller does not say the side, it is the source (what translation encodes).
    encode = encode_source

    def decode(self, ids) -> list[str]:
        """Target id sequences -> text, one string per sequence (a list of sequences or a 2-D array):
        cut at the first eos, special ids dropped, pieces joined by ``target.spm`` (see the module)."""
        out = []
        for seq in cut_at_eos(ids, self.eos_id):
            pieces = [self.id_to_piece(t) for t in seq if t not in self._special_ids]
            text = self._target.decode_pieces(pieces) if pieces else ""
            out.append(text.replace("\u2581", " ").strip())
        return out

    def id_to_piece(self, i: int) -> str:
        """The piece of model id ``i`` (the unk token's string for an id the map does not hold)."""
        return self._id_to_piece.get(int(i), self.tokens["unk"])

    def piece_to_id(self, piece: str) -> int:
        """The model id of a piece (``unk_id`` when the map does not hold it)."""
        return int(self._pieces.get(piece, self.unk_id))

    def __repr__(self) -> str:
        return (f"MarianVocab(size={self.size}, eos={self.eos_id}, unk={self.unk_id}, pad={self.pad_id}, "
                f"bos={self.bos_id})")
