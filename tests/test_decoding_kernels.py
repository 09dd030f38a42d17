"""numformer/kernels/decoding.py against the plain math it replaces (numformer.decode's log_softmax and ban).

Beam candidates: the best n of ``scores + log_softmax(logits)`` per sentence with padding/BOS banned and
EOS forced; greedy pick: the arg-max of the same log-probabilities and its value; take_rows_: ``buf[index]``
for a permutation (in place) and for a shrinking batch (a new array).
"""
from __future__ import annotations

import numpy as np

from numformer.decode import ban_special, log_softmax
from numformer.kernels.decoding import beam_candidates, greedy_pick, take_rows_

PAD, BOS, EOS = 0, 1, 2


def _plain_logp(logits, force):
    logp = ban_special(log_softmax(logits.astype(np.float64)), PAD, BOS)
    logp[force] = -np.inf
    logp[force, ..., EOS] = 0.0
    return logp


def test_beam_candidates_are_the_best_of_scores_plus_log_softmax():
    rng = np.random.default_rng(0)
    m, k, v = 5, 3, 50
    logits = rng.standard_normal((m * k, v)) * 3
    scores = np.log(rng.uniform(0.01, 1, (m, k)))
    scores[1, 1:] = -np.inf  # a sentence at its first step: only beam 0 is live
    force = np.array([False, False, True, False, False])
    cand = (scores[:, :, None] + _plain_logp(logits.reshape(m, k, v), force)).reshape(m, k * v)
    top, top_scores = beam_candidates(logits.copy(), scores, 2 * k, PAD, BOS, EOS, force)
    expected = np.sort(cand, axis=1)[:, ::-1][:, : 2 * k]
    np.testing.assert_allclose(top_scores, expected, rtol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(cand, top, axis=1), top_scores, rtol=1e-12)  # indices match values
    assert set((top[2][np.isfinite(top_scores[2])] % v).tolist()) == {EOS}  # forced: only EOS is finite
    assert not np.isin(top % v, [PAD, BOS]).any()


def test_greedy_pick_is_the_argmax_of_log_softmax():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 40)) * 4
    logits[3, PAD] = 100.0  # padding would win without the ban
    force = np.array([False, True, False, False, False, True])
    logp = _plain_logp(logits, force)
    nxt, gained = greedy_pick(logits.copy(), PAD, BOS, EOS, force)
    np.testing.assert_array_equal(nxt, logp.argmax(axis=1))
    np.testing.assert_allclose(gained, logp.max(axis=1), rtol=1e-12, atol=1e-12)


def test_take_rows_in_place_permutation_and_shrink():
    rng = np.random.default_rng(2)
    buf = rng.standard_normal((5, 2, 8, 3))
    view = buf[:, :, :4]  # a cache view of the first 4 positions
    index = np.array([0, 0, 3, 2, 4])
    expected = view[index].copy()
    assert take_rows_(view, index) is view
    np.testing.assert_array_equal(view, expected)
    np.testing.assert_array_equal(buf[:, :, :4], expected)  # written through to the buffer
    shrunk = take_rows_(buf, np.array([4, 1]))
    np.testing.assert_array_equal(shrunk, buf[[4, 1]])
