"""Fast embedding backward on the host: the scatter-add sorted by token id.

Same inputs and outputs as :func:`numformer.layers.embedding.embedding_backward`. The rows
are sorted by id; the first row of each distinct id is added with one fancy-indexed
``+=`` (indices unique there, so nothing is lost), the remaining duplicates with
``np.add.at``. Measured (2,560 rows of 256 into 8,000): 1.7 ms, against 4.2 ms for
``np.add.at`` alone and 8.3 ms for sort + ``np.add.reduceat``.
"""
from __future__ import annotations

import numpy as np

from .twins import on_host, replaces


@replaces("numformer.layers.embedding.embedding_backward", when=on_host)
def embedding_backward_fast(grad, ids, dy, scale: float):
    n = ids.size
    if n == 0:
        return grad
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    rows = dy[order]  # a gathered copy: scaling it in place touches nothing else
    rows *= np.asarray(scale, dtype=rows.dtype)
    grad[sorted_ids[first]] += rows[first]   # unique indices: a plain fancy-indexed += loses nothing
    if not first.all():
        rest = ~first
        _add_duplicates(grad, sorted_ids[rest], rows[rest])
    return grad


def _add_duplicates(grad, ids, rows):
    """The rows whose id came earlier in the sorted order: ``np.add.at`` sums repeats correctly."""
    np.add.at(grad, ids, rows)
