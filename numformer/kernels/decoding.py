"""Fast pieces of the searches of :mod:`numformer.decoding.search` (Section 6.1): fewer passes over the
(rows, vocab) scores per step.

* :func:`beam_candidates_fast` (replaces ``numformer.decoding.search.beam_candidates``): log-softmax, the ban on padding/BOS,
  the forced EOS and the beam scores folded into the logits in place, then the best ``n`` candidates
  per sentence. The plain form is ``cand = scores[:, :, None] + log_softmax(logits)`` and a sort of
  each k*V row; here the (m, k*V) candidate matrix is the logits buffer itself (no new (m, k*V) arrays: the logits are not needed afterwards), and
  the top ``n`` are found by :func:`top_n` on the host or a sort on a GPU.
* :func:`top_n`: the ``n`` largest of each row in two small partitions instead of one over the row:
  columns are dealt into G groups, the n groups with the largest maxima hold the n largest entries
  (if an entry of the top n lay in another group, the n better groups' maxima would be n entries
  above it), so only those n groups are searched (measured 5.7 -> 1.7 ms on (120, 32000) float32).
* :func:`greedy_pick_fast` (replaces ``numformer.decoding.search.greedy_pick``): the arg-max token of each row and its
  log-probability, without forming the log-softmax (the arg-max of the logits is the arg-max of the
  log-probabilities).

On the host both run their passes block by block over whole sentences (:data:`BLOCK_ELEMENTS` scores
each, cache-resident through the passes) in the host threads (:func:`~.host.threads.parallel_rows`).

Unlike the training kernels, these two run on cupy arrays as well (everything here goes through
``xp``): on a GPU they fold the same passes into the logits and take the top ``n`` with a sort.

Shapes: logits (m*k, V) for m sentences of k beams, or (B, V); scores (m, k).
"""
from __future__ import annotations

from ..backend import get_array_module, is_cupy_array
from .host.threads import parallel_rows
from .twins import replaces

# elements per block of the per-step passes: a few sentences' k*V scores, cache-resident through the passes,
# few enough blocks that numpy's per-call cost stays small (measured on (115*4, 8000) float32, docs/speed.md)
BLOCK_ELEMENTS = 1 << 18


def _log_normaliser(logits):
    """Row-wise log-sum-exp of (N, V) logits as an (N, 1) column (one exp pass into a scratch buffer)."""
    xp = get_array_module(logits)
    top = logits.max(axis=-1, keepdims=True)
    scratch = xp.subtract(logits, top)
    xp.exp(scratch, out=scratch)
    return top + xp.log(scratch.sum(axis=-1, keepdims=True))


def _ban(logp, pad_id: int, bos_id: int) -> None:
    """Padding and BOS are never generated (in place)."""
    xp = get_array_module(logp)
    logp[..., pad_id] = -xp.inf
    logp[..., bos_id] = -xp.inf


@replaces("numformer.decoding.search.greedy_pick")
def greedy_pick_fast(logits, pad_id: int, bos_id: int, eos_id: int, force_eos):
    """(N, V) logits -> (next token (N,), its log-probability (N,)); the logits are overwritten.

    The arg-max of the logits is the arg-max of the log-probabilities, so the log-softmax is never
    formed: only the picked entry is normalised. Forced rows take EOS at the model's own log-probability.
    On the host, row blocks run in the host threads (:data:`BLOCK_ELEMENTS` each, cache-resident).
    """
    xp = get_array_module(logits)
    # filled so that a row no block wrote is plainly wrong (-1, NaN), never a stale value
    nxt = xp.full(logits.shape[0], -1, dtype=xp.int64)
    gained = xp.full(logits.shape[0], xp.nan, dtype=logits.dtype)

    def block(z, force, nxt_out, gained_out):
        lse = _log_normaliser(z)[:, 0]
        _ban(z, pad_id, bos_id)
        nxt_out[:] = xp.where(force, eos_id, z.argmax(axis=1))
        gained_out[:] = xp.take_along_axis(z, nxt_out[:, None], axis=1)[:, 0] - lse

    parallel_rows(block, logits, xp.asarray(force_eos), nxt, gained, chunk_elements=BLOCK_ELEMENTS)
    return nxt, gained


@replaces("numformer.decoding.search.beam_candidates")
def beam_candidates_fast(logits, scores, n: int, pad_id: int, bos_id: int, eos_id: int, force_eos):
    """The ``n`` best extensions of each sentence's beams, best first; the logits are overwritten.

    logits (m*k, V), scores (m, k) (the beams' log-probabilities so far, -inf for unused beams),
    force_eos (m,) bool -> (index (m, n) into the flattened (k*V) candidates, their total
    scores (m, n)). A candidate's score is ``scores[s, j] + log_softmax(logits)[s*k + j, token]``.
    On the host, blocks of whole sentences run in the host threads, each block's passes (log-sum-exp,
    the scores folded in, the bans, the forced EOS, the top ``n``) over cache-resident rows.
    """
    xp = get_array_module(logits)
    m, k = scores.shape
    vocab = logits.shape[-1]
    top = xp.full((m, n), -1, dtype=xp.int64)  # -1 and NaN where no block wrote, never a stale value
    top_scores = xp.full((m, n), xp.nan, dtype=logits.dtype)

    def block(cand, sc, force, top_out, scores_out):
        # logits - lse + score, in place: the candidate matrix without a new (m, k*V) array
        cand -= _log_normaliser(cand) - sc[:, :, None]
        _ban(cand, pad_id, bos_id)
        eos = cand[force, :, eos_id]  # a copy: the model's own EOS scores of the forced sentences
        cand[force] = -xp.inf
        cand[force, :, eos_id] = eos
        flat = cand.reshape(cand.shape[0], k * vocab)
        if is_cupy_array(flat) or n >= flat.shape[1]:
            idx = xp.argsort(-flat, axis=1)[:, :n]
            vals = xp.take_along_axis(flat, idx, axis=1)
        else:
            idx, vals = top_n(flat, n)
        order = xp.argsort(-vals, axis=1)
        top_out[:] = xp.take_along_axis(idx, order, axis=1)
        scores_out[:] = xp.take_along_axis(vals, order, axis=1)

    parallel_rows(block, logits.reshape(m, k, vocab), scores.astype(logits.dtype, copy=False),
                  xp.asarray(force_eos), top, top_scores, chunk_elements=BLOCK_ELEMENTS)
    return top, top_scores


def top_n(a, n: int, rows_per_group: int = 16):
    """(indices, values) of the ``n`` largest entries of each row of a host (m, w) array, unordered.

    Column c belongs to group ``c % G`` with ``G = w / L`` and L the largest divisor of w up to
    ``rows_per_group``; the group maxima (one pass, an elementwise maximum of L slices) pick the n
    groups to search. Falls back to one partition of the whole row where w has no such divisor.
    """
    xp = get_array_module(a)
    m, w = a.shape
    groups_len = next((d for d in range(min(rows_per_group, w), 1, -1) if w % d == 0), 1)
    g = w // groups_len
    if groups_len < 2 or g <= n:
        top = xp.argpartition(a, w - n, axis=1)[:, -n:]
        return top, xp.take_along_axis(a, top, axis=1)
    a3 = a.reshape(m, groups_len, g)                       # a3[r, l, j] = a[r, l * g + j]
    best_groups = xp.argpartition(a3.max(axis=1), g - n, axis=1)[:, -n:]          # (m, n)
    vals = xp.take_along_axis(a3, best_groups[:, None, :], axis=2).reshape(m, -1)  # (m, L * n)
    cols = (xp.arange(groups_len)[None, :, None] * g + best_groups[:, None, :]).reshape(m, -1)
    pick = xp.argpartition(vals, vals.shape[1] - n, axis=1)[:, -n:]
    return xp.take_along_axis(cols, pick, axis=1), xp.take_along_axis(vals, pick, axis=1)
