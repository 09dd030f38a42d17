"""Where two arrays differ, in the exercise's own terms: the masked positions, padding rows, repeated ids,
dropped positions (``Exercise.entry_sets``), one row, column or head; else how many entries."""
from __future__ import annotations

import numpy as np

from .candidates import relative_errors
from .counterparts import factor

WRONG = 1e-6    # an entry differs (relative, as the grading's tolerance)

# the entry sets' names (Exercise.entry_sets), as a sentence says them
WORDS = {"masked": "masked positions", "padding": "padding rows", "repeated ids": "rows of repeated ids",
         "dropped": "dropped positions"}
_AXES = {2: {0: "row", 1: "column"}, 3: {1: "row", 2: "column"}, 4: {1: "head", 2: "row", 3: "column"}}


def entry_pattern(ex, args: dict, got, ref) -> tuple:
    """(pattern, words) of where ``got`` differs from ``ref``, in the exercise's own terms when it can."""
    bad = relative_errors(got, ref, max(1e-3 * float(np.abs(ref).max()), 1e-300)) > WRONG
    n_bad, size = int(bad.sum()), bad.size
    c = factor(got, ref)
    if c is not None:
        return None, f"it is numformer's times {c:.6g}"
    sets = {}
    try:
        given = ex.entry_sets(args, ref.shape) if ex.entry_sets is not None else {}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        given = {}
    for name, where in given.items():
        try:
            sets[name] = np.broadcast_to(np.asarray(where, dtype=bool), ref.shape)
        except ValueError:
            continue  # words for entries of another shape (the scores' mask, not the queries')
    live = (ref != 0) | (got != 0)  # where the two can differ at all (both zero: equal whatever was done)
    masked = sets.get("masked")
    kept = None if masked is None else ~masked & live
    if kept is not None and kept.any() and not got[~masked].any() and bad[kept].sum() >= 0.9 * kept.sum():
        return "mask reversed", ("it is zero at every position the mask keeps, where numformer's has the scores' "
                                 "gradient: the mask is applied the wrong way round (it keeps what it should zero)")
    for name, where in sets.items():
        if _exactly(bad, where & live):
            return name, (f"it is wrong exactly at the {WORDS.get(name, name)} ({n_bad} of {size} entries) and right "
                          "everywhere else")
    for name, where in sets.items():  # numformer's is zero there (padding takes no gradient), the student's not
        if where.any() and not ref[where].any() and (got[where] != 0).sum() >= 0.9 * where.sum():
            return name, (f"at the {WORDS.get(name, name)}, where numformer's is zero, it is not; it differs at "
                          f"{n_bad} of {size} entries in all")
    if (ref == 0).any() and np.array_equal(got == 0, ref != 0):
        return None, "it is zero exactly where numformer's is not, and not zero where numformer's is"
    for axis, word in _AXES.get(bad.ndim, {}).items():
        hit = np.flatnonzero(bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis)))
        if len(hit) == 1 and bad.shape[axis] > 1:
            return word, f"it is wrong in one {word} only ({word} {hit[0]}: {n_bad} of {size} entries)"
    return None, f"it differs at {n_bad} of {size} entries"


def _exactly(bad, where) -> bool:
    """``bad`` lies inside ``where`` and covers at least 90% of it (an entry may agree by chance)."""
    return bool(where.any()) and not bad[~where].any() and bad[where].sum() >= 0.9 * where.sum()

