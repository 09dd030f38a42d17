"""Encoding a large corpus fast: each distinct word through sentencepiece once, then a table lookup.

sentencepiece splits the text at spaces before it applies its pieces (``split_by_whitespace``, the
default numformer trains with), and no piece holds a space except as its first character (``▁``), so
the encoding of a line is the concatenation of the encodings of its words, each encoded as if it
started a line (sentencepiece puts a ``▁`` before the first word, the space does before the others).
Real text repeats its words (Zipf's law): a million pairs of WMT-like text hold some 10^5-10^6
distinct words in 2*10^7 running ones, so encoding the distinct ones (sentencepiece's batch encoding,
with its threads) and looking the rest up costs a fraction of encoding every line.

The equality is checked, not assumed: :meth:`CachedEncoder.encode` compares its result with
sentencepiece's own on the first lines it sees (:data:`CHECK_LINES`), and on any difference
encodes every line with sentencepiece from then on.

:func:`encode_file` streams one side of a split through the encoder into the binary format
(:mod:`numformer.data.binary`): one block of lines in memory at a time.
"""
from __future__ import annotations

import os
from itertools import chain
from pathlib import Path

import numpy as np

from .binary import NpyAppender
from .errors import DataError

#: Lines of the first block compared with sentencepiece's own encoding.
CHECK_LINES = 2000
#: Distinct words kept; the cache starts afresh beyond this (bounds the memory of preparation).
MAX_WORDS = 2_000_000


class CachedEncoder:
    """Normalised lines -> (ids concatenated, lengths), through a word cache (see the module).

    Args:
        vocab: a :class:`~numformer.data.vocab.SubwordVocab` (or a
            :class:`~numformer.data.marian_vocab.MarianVocab`, whose two sides split text apart).
        threads: sentencepiece threads for the batch encodings (default: every core).
        dtype: the dtype of the returned ids.
        side: ``"src"`` or ``"tgt"``: the lines are encoded with ``vocab.encode_source`` or
            ``vocab.encode_target``.
    Attributes:
        exact_words: False once a check found a line the word cache encodes differently (then
            every line goes through sentencepiece).
    """

    def __init__(self, vocab, threads: int | None = None, dtype=np.int32, max_words: int = MAX_WORDS,
                 side: str = "src"):
        if side not in ("src", "tgt"):
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
        self.vocab = vocab
        self.side = side
        self._encode_lines = vocab.encode_source if side == "src" else vocab.encode_target
        self.threads = int(threads or os.cpu_count() or 1)
        self.dtype = np.dtype(dtype)
        self.max_words = max_words
        self.exact_words = True
        self._checked = False
        self._reset()

    def _reset(self) -> None:
        self._index: dict[str, int] = {}
        self._tokens = np.zeros(0, dtype=self.dtype)   # the cached words' ids, concatenated
        self._starts = np.zeros(0, dtype=np.int64)     # word w: _tokens[_starts[w]:_starts[w] + _lens[w]]
        self._lens = np.zeros(0, dtype=np.int64)

    def encode(self, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids of every line concatenated, ``dtype``; (len(lines),) int64 token counts)."""
        if not self._checked and lines:
            self._checked = True
            head = lines[:CHECK_LINES]
            mine, theirs = self._by_words(head), self._by_lines(head)
            self.exact_words = all(np.array_equal(a, b) for a, b in zip(mine, theirs))
        return self._by_words(lines) if self.exact_words else self._by_lines(lines)

    def _by_lines(self, lines):
        ids = self._encode_lines(lines, num_threads=self.threads)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=self.dtype, count=int(lengths.sum()))
        return flat, lengths

    def _by_words(self, lines):
        # Normalised lines hold single spaces between words and no other whitespace: a line's words
        # are its spaces + 1 (0 for an empty line), counted on the bytes in one pass.
        text = "\n".join(lines)
        words = text.split()
        raw = np.frombuffer((text + "\n").encode("utf-8"), dtype=np.uint8)
        ends = np.flatnonzero(raw == 10)
        spaces = np.zeros(raw.size + 1, dtype=np.int64)
        np.cumsum(raw == 32, out=spaces[1:])
        starts = np.concatenate([[0], ends[:-1] + 1])
        counts = spaces[ends] - spaces[starts] + (ends > starts)
        del text, raw, spaces
        index = self._index
        new = [w for w in set(words) if w not in index]
        if len(index) + len(new) > self.max_words:
            self._reset()
            index = self._index
            new = list(set(words))
        if new:
            self._add(new)
        widx = np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words))
        wlen = self._lens[widx]
        # Token j of the block is token (j - tokens of earlier words) of its word.
        before = np.cumsum(wlen) - wlen
        flat = self._tokens[np.repeat(self._starts[widx] - before, wlen) + np.arange(int(wlen.sum()))]
        bounds = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        cum = np.zeros(wlen.size + 1, dtype=np.int64)
        np.cumsum(wlen, out=cum[1:])
        return flat, cum[bounds[1:]] - cum[bounds[:-1]]

    def _add(self, words: list[str]) -> None:
        ids = self._encode_lines(words, num_threads=self.threads)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        first = len(self._index)
        self._index.update(zip(words, range(first, first + len(words))))
        starts = self._tokens.size + np.cumsum(lens) - lens
        self._tokens = np.concatenate([self._tokens, np.fromiter(chain.from_iterable(ids), dtype=self.dtype,
                                                                 count=int(lens.sum()))])
        self._starts = np.concatenate([self._starts, starts])
        self._lens = np.concatenate([self._lens, lens])


def encode_file(encoder: CachedEncoder, blocks, stem: Path, n_lines: int) -> int:
    """Encode blocks of lines into ``<stem>.ids.npy`` and ``<stem>.offsets.npy``; returns the token count.

    ``n_lines``: the lines counted before; a different number read means the file changed while it
    was read, a DataError (neither file is written then).
    """
    with NpyAppender(stem.with_name(stem.name + ".ids.npy"), encoder.dtype) as ids, \
            NpyAppender(stem.with_name(stem.name + ".offsets.npy"), np.int64) as offsets:
        offsets.append([0])
        total = 0
        for lines in blocks:
            flat, lengths = encoder.encode(lines)
            ids.append(flat)
            offsets.append(total + np.cumsum(lengths))
            total += int(lengths.sum())
        if offsets.n != n_lines + 1:
            raise DataError(f"{stem.name} changed while it was being prepared ({offsets.n - 1} lines read, "
                            f"{n_lines} counted): prepare again once it is written")
    return total
