"""Encoded sentence pairs as flat arrays: token ids concatenated in one array plus offsets.

The binary dataset of a prepared corpus (fairseq-preprocess's habit): per split and side two ``.npy``
files, opened with ``np.load(mmap_mode="r")`` so that every run, and every MPI rank on the host,
shares the operating system's one copy of the pages instead of holding the corpus itself::

    train.src.ids.npy       (n_tokens,) uint16 (int32 when the vocabulary has more than 65,536 pieces)
    train.src.offsets.npy   (N + 1,) int64: sentence i is ids[offsets[i]:offsets[i + 1]]
    train.tgt.ids.npy / train.tgt.offsets.npy, and the same for valid and test

No bos/eos is stored: batching adds them (numformer/data/batching.py). A batch gathers its rows from
the map (:meth:`TokenPairs.batch`): only the pages of those sentences are read.
"""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np

from ..files import atomic_file
from .batching import Batch, pad_rows
from .errors import DataError

SIDES = ("src", "tgt")


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest id dtype for a vocabulary: uint16 up to 65,536 pieces (half the bytes of int32)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


class TokenPairs:
    """N sentence pairs as (ids, offsets) per side; in memory or memory-mapped.

    Attributes:
        src_ids, tgt_ids: (n_tokens,) flat token ids of each side.
        src_offsets, tgt_offsets: (N + 1,) int64; row i of a side is ``ids[offsets[i]:offsets[i+1]]``.
    """

    def __init__(self, src_ids, src_offsets, tgt_ids, tgt_offsets):
        if len(src_offsets) != len(tgt_offsets):
            raise DataError(f"{len(src_offsets) - 1} source sentences but {len(tgt_offsets) - 1} target sentences: "
                            "pass the two sides of the same pairs")
        self.src_ids, self.src_offsets = src_ids, src_offsets
        self.tgt_ids, self.tgt_offsets = tgt_ids, tgt_offsets
        self._lengths = None

    @classmethod
    def from_lists(cls, src_ids, tgt_ids) -> "TokenPairs":
        """From two equally long sequences of id sequences (in memory; for tests and small data)."""
        if len(src_ids) != len(tgt_ids):
            raise DataError(f"{len(src_ids)} source sequences but {len(tgt_ids)} target sequences: "
                            "pass the two sides of the same pairs")
        return cls(*_flatten(src_ids), *_flatten(tgt_ids))

    @classmethod
    def open(cls, folder, split: str) -> "TokenPairs":
        """Memory-map ``folder/<split>.{src,tgt}.{ids,offsets}.npy`` (read-only)."""
        arrays = []
        for side in SIDES:
            for part in ("ids", "offsets"):
                path = Path(folder) / f"{split}.{side}.{part}.npy"
                try:
                    arrays.append(np.load(path, mmap_mode="r"))
                except (OSError, ValueError) as exc:
                    raise DataError(f"cannot open the prepared dataset file {path} ({exc}): prepare the corpus "
                                    "again with python -m numformer.prepare") from None
        return cls(*arrays)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(src_len, tgt_len): (N,) int32 each, token counts without bos/eos (read once, then kept).

        4 bytes per pair and side, the only per-pair arrays a training process keeps besides the
        epoch's plan. Memory-mapped offsets are read from their file in blocks (:func:`_lengths`):
        touching every page of the map would count the whole offsets file (16 bytes a pair) in this
        process's resident memory.
        """
        if self._lengths is None:
            self._lengths = tuple(_lengths(o) for o in (self.src_offsets, self.tgt_offsets))
        return self._lengths

    def rows(self, side: str, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``index`` of one side: (their ids concatenated, int64; (B,) lengths)."""
        ids, offsets = (self.src_ids, self.src_offsets) if side == "src" else (self.tgt_ids, self.tgt_offsets)
        starts = np.asarray(offsets[index], dtype=np.int64)
        lengths = np.asarray(offsets[index + 1], dtype=np.int64) - starts
        # Position j of the concatenation is token j - (tokens of earlier rows) of its row.
        before = np.cumsum(lengths) - lengths
        flat = np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))
        return np.asarray(ids[flat], dtype=np.int64), lengths

    def batch(self, index, pad_id: int, bos_id: int, eos_id: int) -> Batch:
        """The :class:`Batch` of pairs ``index`` ((B,) ints): rows gathered from the arrays, then padded."""
        index = np.asarray(index, dtype=np.int64)
        src_flat, src_len = self.rows("src", index)
        tgt_flat, tgt_len = self.rows("tgt", index)
        return Batch(src=pad_rows(src_flat, src_len, pad_id, suffix=eos_id),
                     tgt_in=pad_rows(tgt_flat, tgt_len, pad_id, prefix=bos_id),
                     tgt_out=pad_rows(tgt_flat, tgt_len, pad_id, suffix=eos_id),
                     n_src_tokens=int(src_len.sum()) + index.size, n_tgt_tokens=int(tgt_len.sum()) + index.size,
                     index=index)

    def side_lists(self, side: str) -> list[list[int]]:
        """One side as a list of id lists (small data only: tests, evaluation helpers)."""
        ids, offsets = (self.src_ids, self.src_offsets) if side == "src" else (self.tgt_ids, self.tgt_offsets)
        return [np.asarray(ids[offsets[i]:offsets[i + 1]]).tolist() for i in range(len(self))]


def _lengths(offsets, block: int = 1 << 20) -> np.ndarray:
    """``diff(offsets)`` as (N,) int32, block by block: no (N,) int64 temporary.

    A memory-mapped ``.npy`` (``np.load(mmap_mode="r")`` gives an ``np.memmap`` that covers its
    whole file after the header) is read with plain file reads, which go through the page cache
    without mapping its pages into this process; through the mapping when the file is gone.
    """
    n = max(len(offsets) - 1, 0)
    out = np.empty(n, dtype=np.int32)
    path = getattr(offsets, "filename", None)
    with _opened_whole(offsets) as f:
        if f is not None:
            f.seek(offsets.offset)
        prev = None
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            # block of offsets[lo + 1 : hi + 1], preceded by offsets[lo]
            cur = np.fromfile(f, dtype=offsets.dtype, count=hi - lo + (prev is None)) if f is not None else \
                np.asarray(offsets[lo + (prev is not None):hi + 1])
            if prev is not None:
                cur = np.concatenate([prev, cur])
            if cur.size != hi - lo + 1:
                raise DataError(f"the offsets file {path} is shorter than its header says: prepare the corpus again")
            np.subtract(cur[1:], cur[:-1], out=out[lo:hi], casting="unsafe")
            prev = cur[-1:]
    return out


@contextlib.contextmanager
def _opened_whole(offsets):
    """The ``.npy`` file a memory-mapped ``offsets`` covers after its header, open for plain reads; None when the
    array is not such a mapping, or when its file was removed since it was mapped (the prepared corpus deleted
    while a run trains: the mapping still holds the pages, so the run goes on, reading through it)."""
    path = getattr(offsets, "filename", None)
    f = None
    if path is not None and offsets.ndim == 1 and offsets.flags.c_contiguous:
        try:
            f = open(path, "rb")  # noqa: SIM115  (closed below)
        except FileNotFoundError:
            f = None
        if f is not None and os.fstat(f.fileno()).st_size != offsets.offset + offsets.nbytes:
            f.close()
            f = None
    try:
        yield f
    finally:
        if f is not None:
            f.close()


def _flatten(seqs) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = (np.concatenate([np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]) if offsets[-1]
           else np.zeros(0, dtype=np.int64))
    return ids, offsets


class NpyAppender:
    """Write a 1-D ``.npy`` file whose length is known only at the end: append chunks, then :meth:`close`.

    The header is written first for length 0 and rewritten in place at the end: numpy pads the
    header so that the shape can grow to 21 digits without moving the data. The file is streamed
    through :func:`numformer.files.atomic_file` (a temporary beside ``path``, renamed on close), so a
    reader never sees a half-written file; :meth:`abort` removes the temporary. As a context
    manager it closes when the block ends and aborts when it raises.
    """

    def __init__(self, path, dtype, durable: bool = True):
        self.path, self.dtype, self.n = Path(path), np.dtype(dtype), 0
        self._writing = atomic_file(self.path, durable)
        self.file = self._writing.__enter__()
        self.header_len = len(self._header(0))
        try:
            self.file.write(self._header(0))
        except BaseException:
            self.abort()
            raise

    def _header(self, n: int) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n,)})
        return buf.getvalue()

    def append(self, values) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(values.tobytes())
        self.n += values.size

    def close(self) -> Path:
        header = self._header(self.n)
        if len(header) != self.header_len:  # cannot happen with numpy's growth padding; checked, not assumed
            self.abort()
            raise RuntimeError(f"npy header of {self.path} changed size")
        self.file.seek(0)
        self.file.write(header)
        self._writing.__exit__(None, None, None)
        return self.path

    def abort(self) -> None:
        # atomic_file removes its temporary when its block ends with an exception.
        self._writing.__exit__(_Aborted, _Aborted(), None)

    def __enter__(self) -> "NpyAppender":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class _Aborted(Exception):
    """Thrown into :func:`atomic_file`'s block to make it drop the temporary."""
