"""The student's arrays against numformer's, by value: equal, a multiple, or a reduction of one.

Used by grad_checks/first_wrong_step.py on the records of grad_checks/recorded_run.py. Two arrays are *the same*
when equal to 1e-9 of their largest entry, up to a transpose of the last two axes or a reshape (:func:`views`); one
is a multiple of the other with a scalar factor (:func:`factor`); or one is the other summed (or averaged) over
axes it has and the first lacks (:func:`reduced`: a table's gradient summed over time as well as over the batch).
"""
from __future__ import annotations

import itertools

import numpy as np

SAME = 1e-9     # an intermediate equals numformer's: within this fraction of its largest entry


def views(a: np.ndarray, shape: tuple):
    """``a`` as an array of ``shape``: itself, reshaped, or its last two axes swapped (then reshaped)."""
    if a.shape == shape:
        yield a
    elif a.size == int(np.prod(shape)):
        yield a.reshape(shape)
    if a.ndim >= 2 and a.shape[-1] != 1 and a.shape[-2] != 1:
        t = a.swapaxes(-1, -2)
        if t.shape == shape:
            yield t
        elif t.size == int(np.prod(shape)):
            yield t.reshape(shape)


def swapped_shape(shape) -> tuple:
    """``shape`` with its last two axes swapped (a transposed layout)."""
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


def same(a, b) -> bool:
    scale = max(float(np.abs(b).max(initial=0.0)), float(np.abs(a).max(initial=0.0)), 1e-300)
    return float(np.abs(a - b).max(initial=0.0)) <= SAME * scale


def factor(a, b):
    """c when ``a`` = c ``b`` with c not 1 (nor 0), else None."""
    bb = float((b * b).sum())
    if bb == 0.0:
        return None
    c = float((a * b).sum()) / bb
    if abs(c - 1.0) <= 1e-9 or abs(c) <= 1e-12:
        return None
    return c if float(np.linalg.norm(a - c * b)) <= SAME * max(float(np.linalg.norm(a)), 1e-300) else None


def reduced(mine, theirs) -> str | None:
    """How ``mine`` is ``theirs`` reduced over axes ``theirs`` has and ``mine`` lacks ("summed over its axis 0 as
    well"), to one or two axes; None when it is not."""
    if mine.size >= theirs.size or theirs.ndim == 0:
        return None
    for k in (1, 2):
        for axes in itertools.combinations(range(theirs.ndim), k):
            for how, fn in (("summed", np.sum), ("averaged", np.mean)):
                r = fn(theirs, axis=axes)
                if r.size == mine.size and same(mine.reshape(r.shape), r):
                    where = " and ".join(map(str, axes))
                    return f"{how} over its ax{'es' if k > 1 else 'is'} {where} as well (shape {tuple(theirs.shape)})"
    return None
