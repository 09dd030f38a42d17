"""Fast label-smoothed cross-entropy on the host: one blocked pass over the logits each way.

Same inputs and outputs as :func:`numformer.loss.smoothed_cross_entropy` and
``smoothed_cross_entropy_backward``. The (tokens, vocab) logits dominate the memory
traffic of a small model's step, so each direction reads them once: per block of rows
(about ``LOSS_BLOCK`` elements, cache-sized, spread over the host threads) forward takes
the row max and sum, ``exp(z - max)``, its row sum and the normalised ``p``; backward
turns ``p`` into the gradient in place (``p`` is consumed). With ``overwrite=True`` p is
written over the logits' own buffer (one (tokens, vocab) array fewer).
"""
from __future__ import annotations

import numpy as np

from .twins import on_host, replaces
from .host.threads import parallel_rows

LOSS_BLOCK = 1 << 17  # elements per block (about L2-sized)


@replaces("numformer.loss.smoothed_cross_entropy", when=on_host)
def smoothed_cross_entropy_fast(z, y, eps: float, keep_probs: bool = True, overwrite: bool = False):
    n, v = z.shape
    z_y = np.take_along_axis(z, y[:, None], axis=1)[:, 0]   # before z may be overwritten
    zmax, zsum, sumexp = (np.empty(n, dtype=z.dtype) for _ in range(3))
    p = (z if overwrite else np.empty_like(z)) if keep_probs else None

    def block(zb, mb, sb, seb, pb=None):
        np.max(zb, axis=1, out=mb)
        np.sum(zb, axis=1, out=sb)
        eb = np.subtract(zb, mb[:, None], out=pb)
        np.exp(eb, out=eb)
        np.sum(eb, axis=1, out=seb)
        if pb is not None:
            pb /= seb[:, None]

    parallel_rows(block, *((z, zmax, zsum, sumexp) if p is None else (z, zmax, zsum, sumexp, p)),
                  chunk_elements=LOSS_BLOCK)
    lse = zmax + np.log(sumexp)
    nll = lse - z_y
    loss = (1.0 - eps) * nll + eps * (lse - zsum / v)
    return loss, nll, p


@replaces("numformer.loss.smoothed_cross_entropy_backward", when=on_host)
def smoothed_cross_entropy_backward_fast(p, y, eps: float, weight):
    shift = eps / p.shape[1]

    def block(pb, wb):
        pb -= shift
        pb *= wb[:, None]

    parallel_rows(block, p, weight, chunk_elements=LOSS_BLOCK)
    p[np.arange(p.shape[0]), y] -= (1.0 - eps) * weight
    return p
