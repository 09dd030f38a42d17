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
        index: (B,) positions of these pairs among all the pairs (``TokenPairs`` rows), to put
            results back in input order.
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


def pad_rows(flat: np.ndarray, lengths: np.ndarray, pad_id: int, prefix: int | None = None,
             suffix: int | None = None) -> np.ndarray:
    """Rows given as one concatenation -> a right-padded (N, L) int64 array.

    ``flat``: the N rows' ids concatenated; ``lengths``: (N,) their lengths. ``prefix``/``suffix``
    (e.g. bos/eos) are added to every row; L is the longest resulting length (at least 1). One
    masked assignment, no loop.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = lengths.size
    offset = 1 if prefix is not None else 0
    width = max(int(lengths.max()) + offset + (1 if suffix is not None else 0) if n else 0, 1)
    out = np.full((n, width), pad_id, dtype=np.int64)
    if n == 0:
        return out
    if prefix is not None:
        out[:, 0] = prefix
    if flat.size:
        cols = np.arange(width)[None, :]
        # Row-major order of the mask matches the concatenation order.
        out[(cols >= offset) & (cols < offset + lengths[:, None])] = flat
    if suffix is not None:
        out[np.arange(n), offset + lengths] = suffix
    return out


class BatchPlan:
    """An epoch's batches as pair indices, not arrays: batch i holds pairs ``order[starts[i]:starts[i+1]]``.

    4 bytes per pair (8 past 2**31 pairs) plus 8 per batch, whatever the sentence lengths; a
    :class:`Batch` is built from the pairs (``TokenPairs.batch``) only when it is trained on.

    Attributes:
        order: (n_pairs,) pair indices, batch after batch: int32 (int64 for 2**31 pairs or more).
        starts: (n_batches + 1,) int64 bounds into ``order``.
        n_filtered: pairs dropped by ``max_len`` (training must log it).
        n_empty: pairs dropped for an empty side (``skip_empty``; training logs it too, issue 59).
        n_pairs: pairs that made it into the batches.
    """

    def __init__(self, order: np.ndarray, starts: np.ndarray, n_filtered: int = 0, n_empty: int = 0):
        self.order, self.starts = order, starts
        self.n_filtered, self.n_empty, self.n_pairs = int(n_filtered), int(n_empty), int(order.size)

    def __len__(self) -> int:
        return int(self.starts.size - 1)

    def __getitem__(self, i: int) -> np.ndarray:
        """The pair indices of batch ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} of {len(self)}")
        return self.order[self.starts[i]:self.starts[i + 1]]


def index_dtype(n: int) -> np.dtype:
    """The narrowest signed dtype that indexes ``n`` items: int32 below 2**31 (half of int64's bytes)."""
    return np.dtype(np.int32) if n < 2 ** 31 else np.dtype(np.int64)


def training_pair_sizes(src_len, tgt_len, max_len: int | None) -> np.ndarray:
    """The size each training pair takes of a batch's token budget, ``(S + 1) + (T + 1)`` (the eos and bos that
    batching adds), for the pairs training keeps (no empty side, within ``max_len``): what ``--max-tokens`` must
    hold for a pair to share a batch. int64, one entry per kept pair."""
    src_len, tgt_len = np.asarray(src_len), np.asarray(tgt_len)
    keep, _, _ = _kept(src_len, tgt_len, max_len, np.int64, skip_empty=True)
    s, t = (src_len, tgt_len) if keep is None else (src_len[keep], tgt_len[keep])
    return s.astype(np.int64) + t.astype(np.int64) + 2


def _kept(src_len: np.ndarray, tgt_len: np.ndarray, max_len: int | None, dtype, block: int = 1 << 20,
          skip_empty: bool = False):
    """(indices of the pairs kept, in ``dtype``; how many are too long; how many have an empty side);
    (None, 0, 0) when all are kept.

    A pair fits when ``src_len + 1 <= max_len`` and ``tgt_len + 1 <= max_len``: the +1 is the eos (or
    bos) that batching adds, so ``max_len`` bounds the array lengths S and T (the positions the model
    must hold). With ``skip_empty`` a pair with no token on a side is left out too: it teaches nothing
    but "stop at once" or "say anything" (issue 59), and a pair is counted once, as empty first.
    Built in blocks: no (N,) int64 temporary.
    """
    n = len(src_len)
    if max_len is None and not skip_empty:
        return None, 0, 0
    if max_len is not None and max_len < 1:
        raise DataError(f"max_len must be at least 1 (it counts the eos token), got {max_len}")
    nonempty = (src_len > 0) & (tgt_len > 0) if skip_empty else np.ones(n, dtype=bool)
    fits = nonempty & (src_len < max_len) & (tgt_len < max_len) if max_len is not None else nonempty
    n_kept, n_nonempty = int(np.count_nonzero(fits)), int(np.count_nonzero(nonempty))
    if n_kept == n:
        return None, 0, 0
    keep, done = np.empty(n_kept, dtype=dtype), 0
    for lo in range(0, n, block):
        part = np.flatnonzero(fits[lo:lo + block])
        keep[done:done + part.size] = part + lo
        done += part.size
    return keep, n_nonempty - n_kept, n - n_nonempty


def plan_batches(src_len, tgt_len, max_tokens: int, shuffle_seed: int | None = None, epoch: int = 0,
                 max_len: int | None = None, skip_empty: bool = False) -> BatchPlan:
    """Cut N pairs, given by their token counts, into token-bounded batches (Section 5.1).

    Args:
        src_len, tgt_len: (N,) token counts per pair, without bos/eos.
        max_tokens: bound on ``B * (S + T)``, padding and the added bos/eos included. A single pair
            larger than that still gets a batch of its own (every kept pair is in exactly one batch).
        shuffle_seed: None = no randomness: batches in length order (evaluation). An int = training
            order: ties within a (src_len, tgt_len) are broken at random and the batch order is
            shuffled, both from ``default_rng([shuffle_seed, epoch])``.
        epoch: mixes into the seed, so each epoch has its own order.
        max_len: leave out pairs whose S or T would exceed it (see :func:`_kept`); the count is in
            ``.n_filtered``.
        skip_empty: leave out pairs with an empty side (training); the count is in ``.n_empty``.
    Returns:
        A :class:`BatchPlan`; :meth:`TokenPairs.batch <numformer.data.binary.TokenPairs.batch>` builds
        batch ``i`` from ``plan[i]`` when it is trained on.

    Vectorised over pairs: one sort per epoch, and the greedy cut takes one window of numpy work
    per batch (not a Python step per sentence), so millions of pairs are planned in seconds. The
    per-pair work arrays are int32 (pair positions, lengths, one sort key), so planning peaks at
    about 30 bytes a pair and keeps 4 (the plan).
    """
    if len(src_len) != len(tgt_len):
        raise DataError(f"{len(src_len)} source sequences but {len(tgt_len)} target sequences: "
                        "pass the two sides of the same pairs")
    if max_tokens < 1:
        raise DataError(f"max_tokens must be positive, got {max_tokens}")
    src_len = np.asarray(src_len)
    tgt_len = np.asarray(tgt_len)
    n = len(src_len)
    idx = index_dtype(n)
    keep, n_filtered, n_empty = _kept(src_len, tgt_len, max_len, idx, skip_empty=skip_empty)
    m = n if keep is None else keep.size
    if m == 0:
        return BatchPlan(np.zeros(0, dtype=idx), np.zeros(1, dtype=np.int64), n_filtered, n_empty)
    # Array lengths including the eos/bos that batching adds.
    longest = max(int(src_len.max()), int(tgt_len.max())) + 1
    len_dtype = np.int32 if longest < 2 ** 30 else np.int64
    s_len = (src_len if keep is None else src_len[keep]).astype(len_dtype) + 1
    t_len = (tgt_len if keep is None else tgt_len[keep]).astype(len_dtype) + 1
    rng = np.random.default_rng([shuffle_seed, epoch]) if shuffle_seed is not None else None
    # One key ordered as (src length, tgt length); a stable sort of it after a random permutation
    # puts equal lengths in a random order, so batch contents change between epochs; without a
    # seed, ties stay in input order (the order np.lexsort((t, s)) gives).
    # Counted from the shortest lengths the key usually fits 16 bits (pairs up to 256 tokens a side),
    # where numpy's stable sort is a radix sort: a tenth of the time of sorting int32 at 4.5M pairs.
    s_min, t_min = int(s_len.min()), int(t_len.min())
    t_span = int(t_len.max()) - t_min + 1
    key_max = (int(s_len.max()) - s_min) * t_span + t_span - 1
    key_dtype = np.uint16 if key_max < 2 ** 16 else np.int32 if key_max < 2 ** 31 else np.int64
    key = s_len.astype(np.int64 if key_dtype == np.int64 else np.int32)  # in place from here: one temporary
    key -= s_min
    key *= t_span
    key += t_len
    key -= t_min
    key = key.astype(key_dtype, copy=False)
    if rng is not None:
        # shuffle of an int32 arange: the same values as rng.permutation(m) and the same RNG state after
        perm = np.arange(m, dtype=idx)
        rng.shuffle(perm)
        key = key[perm]
        order = perm[np.argsort(key, kind="stable")]
        del perm
    else:
        order = np.argsort(key, kind="stable").astype(idx)
    del key
    s_sorted, t_sorted = s_len[order], t_len[order]
    del s_len, t_len
    starts = _greedy_cut(s_sorted, t_sorted, max_tokens)
    del s_sorted, t_sorted
    if rng is not None:  # shuffle the batch order: move whole segments of ``order``
        sizes = np.diff(starts)
        pick = rng.permutation(sizes.size)
        new_sizes = sizes[pick]
        new_starts = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(new_sizes, out=new_starts[1:])
        gather = np.repeat((starts[:-1][pick] - new_starts[:-1]).astype(idx), new_sizes)
        gather += np.arange(m, dtype=idx)
        order, starts = order[gather], new_starts
        del gather
    return BatchPlan(order if keep is None else keep[order], starts, n_filtered, n_empty)


def _greedy_cut(s_len: np.ndarray, t_len: np.ndarray, max_tokens: int) -> np.ndarray:
    """Bounds of the greedy cut of sorted pairs: a batch grows while ``count * (max S + max T)`` fits.

    ``s_len`` is non-decreasing (the pairs are sorted by it), so the longest source of a batch is
    its last one. A pair that alone exceeds ``max_tokens`` still gets a batch. A batch starting
    with lengths (s, t) holds at most ``max_tokens // (s + t)`` pairs (the maxima only grow), so
    its end is found in a window of that many pairs: ``count * (s + running max of t)`` never
    decreases along the window, and a binary search finds the first over-full position. One short
    numpy pass per batch, the same cut as a pair-by-pair loop.
    """
    n = s_len.size
    counts = np.arange(1, min(n, max_tokens // 2 + 2) + 1, dtype=np.int64)  # s + t >= 2
    bounds = [0]
    start = 0
    while start < n:
        stop = min(n, start + max_tokens // int(s_len[start] + t_len[start]) + 2)
        cost = counts[:stop - start] * (s_len[start:stop] + np.maximum.accumulate(t_len[start:stop]))
        fit = int(np.searchsorted(cost, max_tokens, side="right"))
        start += max(fit, 1)  # the first pair always goes in
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)
