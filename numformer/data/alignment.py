"""Sentence alignment by length (Gale & Church 1993, "A program for aligning sentences in bilingual
corpora", simplified), for any pair of texts cut into segments in order.

The length model: a translation's length is about ``ratio`` times its source's, with a spread that
grows like the square root of the length, so

``d = (tgt_len - ratio * src_len) / (scale * sqrt((src_len + tgt_len) / 2))``

is about N(0, 1) for true translations and large for misaligned pairs (:func:`length_deviation`);
``ratio`` and ``scale`` are estimated robustly from pairs that are mostly right
(:func:`estimate_length_model`). :func:`align_lengths` finds the cheapest monotone sequence of beads
(1-1, 2-1, 1-2, 1-0, 0-1) by dynamic programming, each bead costing ``d**2 / 2`` (a negative log
likelihood under the model) plus a penalty for its kind, plus optional terms for a cue translations
keep (question marks) and for labels the segments already carry (references).
"""

from __future__ import annotations

import math

import numpy as np

#: Bead penalties (negative log prior, in the same units as d**2 / 2).
#: Gale & Church's priors give about 0.1 / 2.4 / 4.6; skips are made dearer
#: here so that noisy but correct 1-1 stretches are not re-aligned.
BEAD_PENALTY = {(1, 1): 0.0, (2, 1): 3.0, (1, 2): 3.0, (1, 0): 6.0, (0, 1): 6.0}
#: Cost per unit of difference in cue counts (question marks) inside a bead:
#: both Bible translations keep questions as questions in 83% of the verses that have one.
MARK_COST = 1.5
#: Bonus for a 1-1 bead that pairs two segments with the same label: the given
#: pairing still wins unless the lengths (or cues) clearly disagree with it.
ANCHOR_BONUS = 2.0
#: Half-width of the band around the diagonal searched by the aligner.
ALIGN_BAND = 12


def length_deviation(src_len, tgt_len, ratio: float, scale: float):
    """Gale-Church style normalised length deviation (scalar or array).

    ``d = (tgt_len - ratio * src_len) / (scale * sqrt((src_len + tgt_len) / 2))``;
    about N(0, 1) for true translations, large for misaligned pairs.
    """
    src_len = np.asarray(src_len, dtype=np.float64)
    tgt_len = np.asarray(tgt_len, dtype=np.float64)
    return (tgt_len - ratio * src_len) / (scale * np.sqrt(np.maximum((src_len + tgt_len) / 2.0, 1.0)))


def estimate_length_model(src_lens, tgt_lens) -> tuple[float, float]:
    """Robust ``(ratio, scale)`` for :func:`length_deviation` from pairs that
    are mostly correct: ratio = median length ratio, scale = 1.4826 * MAD of
    the unscaled deviation (both resist the misaligned minority)."""
    src = np.asarray(src_lens, dtype=np.float64)
    tgt = np.asarray(tgt_lens, dtype=np.float64)
    ratio = float(np.median(tgt / src))
    z = length_deviation(src, tgt, ratio, 1.0)
    scale = float(1.4826 * np.median(np.abs(z - np.median(z))))
    return ratio, max(scale, 1e-6)


def align_lengths(src_lens, tgt_lens, ratio: float, scale: float, band: int = ALIGN_BAND,
                  src_marks=None, tgt_marks=None, src_keys=None, tgt_keys=None) -> list[tuple[int, int, int, int]]:
    """Monotone sentence alignment by length (Gale & Church 1993, simplified).

    Args:
        src_lens, tgt_lens: character lengths of the n source and m target
            segments, in order.
        ratio, scale: the length model (see :func:`length_deviation`).
        band: only cells with ``|j - i * m / n| <= band`` are searched.
        src_marks, tgt_marks: optional per-segment counts of a cue that
            translations keep (e.g. question marks); each unit of
            difference inside a bead costs ``MARK_COST``.
        src_keys, tgt_keys: optional per-segment labels (e.g. verse
            references); a 1-1 bead whose labels are equal gets
            ``ANCHOR_BONUS`` off, so the aligner leaves the labelled
            pairing alone unless the lengths clearly disagree with it.
    Returns:
        Beads ``(i0, i1, j0, j1)`` covering both sequences in order: source
        segments ``i0:i1`` align with target segments ``j0:j1``; one side may
        be empty (a 1-0 or 0-1 bead). Cost of a bead: ``d**2 / 2`` of the
        joined lengths, plus ``BEAD_PENALTY``, plus the cue terms.
    """
    n, m = len(src_lens), len(tgt_lens)
    cs = np.concatenate([[0], np.cumsum(src_lens)]).tolist()
    ct = np.concatenate([[0], np.cumsum(tgt_lens)]).tolist()
    qs = np.concatenate([[0], np.cumsum(src_marks if src_marks is not None else np.zeros(n))]).tolist()
    qt = np.concatenate([[0], np.cumsum(tgt_marks if tgt_marks is not None else np.zeros(m))]).tolist()
    beads = list(BEAD_PENALTY.items())
    cost = {(0, 0): 0.0}
    back = {}
    slope = m / n if n else 0.0
    for i in range(n + 1):
        centre = round(i * slope)
        lo, hi = max(0, centre - band), min(m, centre + band)
        if i == n:
            hi = m  # the band must reach (n, m), also when n or m is 0
        for j in range(lo, hi + 1):
            if i == 0 and j == 0:
                continue
            best, best_bead = math.inf, None
            for (di, dj), penalty in beads:
                prev = cost.get((i - di, j - dj))
                if prev is None:
                    continue
                c = prev + penalty
                if di and dj:
                    ls, lt = cs[i] - cs[i - di], ct[j] - ct[j - dj]
                    d = (lt - ratio * ls) / (scale * math.sqrt(max((ls + lt) / 2.0, 1.0)))
                    c += 0.5 * d * d + MARK_COST * abs((qs[i] - qs[i - di]) - (qt[j] - qt[j - dj]))
                    if di == 1 and dj == 1 and src_keys is not None and src_keys[i - 1] == tgt_keys[j - 1]:
                        c -= ANCHOR_BONUS
                if c < best:
                    best, best_bead = c, (di, dj)
            if best_bead is not None:
                cost[(i, j)] = best
                back[(i, j)] = best_bead
    out = []
    i, j = n, m
    while (i, j) != (0, 0):
        di, dj = back[(i, j)]
        out.append((i - di, i, j - dj, j))
        i, j = i - di, j - dj
    out.reverse()
    return out
