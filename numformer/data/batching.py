"""Batching by token count (paper, section 5.1: "Sentence pairs were batched
together by approximate sequence length").

Pairs are sorted by (source length, target length) and cut greedily into
batches whose padded size ``B * (S + T)`` stays within ``max_tokens``, so
little compute is spent on padding. Per epoch, with a seed, the ties inside
a length are broken randomly (batches differ from epoch to epoch) and the
batch order is shuffled; the same (seed, epoch) always gives the same
batches.

Array layout of a :class:`Batch` (``B`` sentences, ``S``/``T`` the longest
source/target length plus one):

- ``src``     (B, S): ``x_1 .. x_n  eos  pad ..``
- ``tgt_in``  (B, T): ``bos  y_1 .. y_m  pad ..``  (decoder input)
- ``tgt_out`` (B, T): ``y_1 .. y_m  eos  pad ..``  (what the loss predicts)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import DataError


@dataclass
class Batch:
    """One training batch; every array is int64.

    Attributes:
        src: (B, S) source ids + eos, right-padded with pad_id.
        tgt_in: (B, T) bos + target ids, right-padded.
        tgt_out: (B, T) target ids + eos, right-padded; position t of
            ``tgt_out`` is the token to predict after reading ``tgt_in[:, :t+1]``.
        n_src_tokens: non-pad entries of ``src`` (eos included).
        n_tgt_tokens: non-pad entries of ``tgt_out`` (eos included): the
            number of tokens the loss is averaged over.
        index: (B,) positions of these pairs in the lists given to
            :func:`make_batches` (to put translations back in input order).
    """

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    n_src_tokens: int
    n_tgt_tokens: int
    index: np.ndarray

    @property
    def size(self) -> int:
        """Number of sentence pairs B."""
        return int(self.src.shape[0])

    @property
    def n_padded_tokens(self) -> int:
        """``B * (S + T)``: the quantity bounded by ``max_tokens``."""
        return int(self.src.size + self.tgt_in.size)


class BatchList(list):
    """A list of :class:`Batch` plus what was left out.

    Attributes:
        n_filtered: pairs dropped by ``max_len`` (training must log it).
        n_pairs: pairs that made it into the batches.
    """

    n_filtered: int = 0
    n_pairs: int = 0


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, prefix: int | None = None,
                  suffix: int | None = None) -> np.ndarray:
    """Stack id sequences into a right-padded (N, L) int64 array.

    ``prefix``/``suffix`` (e.g. bos/eos) are added to every sequence; L is
    the longest resulting length (at least 1). Vectorised over tokens: one
    concatenation and one masked assignment (the only loop is over
    sentences, to turn each into an array).
    """
    n = len(seqs)
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=n)
    offset = 1 if prefix is not None else 0
    total = lengths + offset + (1 if suffix is not None else 0)
    width = max(int(total.max()) if n else 0, 1)
    out = np.full((n, width), pad_id, dtype=np.int64)
    if n == 0:
        return out
    if prefix is not None:
        out[:, 0] = prefix
    if lengths.sum():
        flat = np.concatenate([np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs])
        cols = np.arange(width)[None, :]
        # Row-major order of the mask matches the concatenation order.
        out[(cols >= offset) & (cols < offset + lengths[:, None])] = flat
    if suffix is not None:
        out[np.arange(n), offset + lengths] = suffix
    return out


def filter_long_pairs(src_ids, tgt_ids, max_len: int | None) -> tuple[np.ndarray, int]:
    """Indices of the pairs that fit ``max_len``, and how many do not.

    A pair fits when ``len(src) + 1 <= max_len`` and ``len(tgt) + 1 <=
    max_len``: the +1 is the eos (or bos) that batching adds, so max_len
    bounds the array lengths S and T (and hence the positions the model
    must support). ``max_len=None`` keeps everything.
    """
    n = len(src_ids)
    if max_len is None:
        return np.arange(n, dtype=np.int64), 0
    if max_len < 1:
        raise DataError(f"max_len must be at least 1 (it counts the eos token), got {max_len}")
    src_len = np.fromiter((len(s) for s in src_ids), dtype=np.int64, count=n)
    tgt_len = np.fromiter((len(t) for t in tgt_ids), dtype=np.int64, count=n)
    keep = np.flatnonzero((src_len + 1 <= max_len) & (tgt_len + 1 <= max_len))
    return keep.astype(np.int64), int(n - keep.size)


def make_batches(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], max_tokens: int,
                 pad_id: int = 0, bos_id: int = 2, eos_id: int = 3, shuffle_seed: int | None = None,
                 epoch: int = 0, max_len: int | None = None) -> BatchList:
    """Cut encoded sentence pairs into token-bounded batches.

    Args:
        src_ids, tgt_ids: N id sequences each (no bos/eos), pair i =
            (src_ids[i], tgt_ids[i]).
        max_tokens: bound on ``B * (S + T)``, padding and the added
            bos/eos included. A single pair larger than that still gets a
            batch of its own (every kept pair is in exactly one batch).
        pad_id, bos_id, eos_id: special ids (numformer's vocabulary: 0, 2, 3).
        shuffle_seed: None = no randomness: batches in length order (for
            evaluation and translation). An int = training order: ties
            within a (src_len, tgt_len) are broken at random and the batch
            order is shuffled, both from ``default_rng([shuffle_seed, epoch])``.
        epoch: mixes into the seed, so each epoch has its own order.
        max_len: drop pairs whose S or T would exceed it (see
            :func:`filter_long_pairs`); the count is in ``.n_filtered``.
    Returns:
        A :class:`BatchList` of :class:`Batch`.
    """
    if len(src_ids) != len(tgt_ids):
        raise DataError(f"{len(src_ids)} source sequences but {len(tgt_ids)} target sequences: "
                        "pass the two sides of the same pairs")
    if max_tokens < 1:
        raise DataError(f"max_tokens must be positive, got {max_tokens}")
    keep, n_filtered = filter_long_pairs(src_ids, tgt_ids, max_len)
    result = BatchList()
    result.n_filtered = n_filtered
    result.n_pairs = int(keep.size)
    if keep.size == 0:
        return result

    # Array lengths including the eos/bos that batching adds.
    src_len = np.fromiter((len(src_ids[i]) + 1 for i in keep), dtype=np.int64, count=keep.size)
    tgt_len = np.fromiter((len(tgt_ids[i]) + 1 for i in keep), dtype=np.int64, count=keep.size)
    rng = np.random.default_rng([shuffle_seed, epoch]) if shuffle_seed is not None else None
    # lexsort is stable: after a random permutation, equal (src, tgt)
    # lengths come out in a random order, so batch contents change between
    # epochs; without a seed, ties stay in input order.
    perm = rng.permutation(keep.size) if rng is not None else np.arange(keep.size)
    order = perm[np.lexsort((tgt_len[perm], src_len[perm]))]

    # Greedy cut of the sorted list. A Python loop over sentences (not
    # tokens): ~30k iterations, a few milliseconds, once per epoch.
    groups, start = [], 0
    max_s = max_t = 0
    for pos, k in enumerate(order):
        s, t = int(src_len[k]), int(tgt_len[k])
        new_s, new_t = max(max_s, s), max(max_t, t)
        count = pos - start
        if count > 0 and (count + 1) * (new_s + new_t) > max_tokens:
            groups.append(order[start:pos])
            start, max_s, max_t = pos, s, t
        else:
            max_s, max_t = new_s, new_t
    groups.append(order[start:])

    if rng is not None:
        groups = [groups[g] for g in rng.permutation(len(groups))]
    for group in groups:
        index = keep[group]
        src_seqs = [src_ids[i] for i in index]
        tgt_seqs = [tgt_ids[i] for i in index]
        src = pad_sequences(src_seqs, pad_id, suffix=eos_id)
        tgt_in = pad_sequences(tgt_seqs, pad_id, prefix=bos_id)
        tgt_out = pad_sequences(tgt_seqs, pad_id, suffix=eos_id)
        result.append(Batch(
            src=src,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            n_src_tokens=int(src_len[group].sum()),
            n_tgt_tokens=int(tgt_len[group].sum()),
            index=index.astype(np.int64),
        ))
    return result
