"""The per-step pieces of the searches, on both kernel sets, against the math written out here.

Beam candidates: the best n of ``scores + log_softmax(logits)`` per sentence with padding/BOS banned and,
where the length budget is spent, EOS the only extension at the model's own EOS log-probability; greedy
pick: the arg-max of the same log-probabilities and its value. The fast versions
(numformer/kernels/decoding.py) are also compared with the plain ones at real sizes in test_kernels.py.
take_rows_: ``buf[index]`` for a permutation (in place) and for a shrinking batch (a new array); top_n:
the n largest entries of each row.
"""
from __future__ import annotations

import numpy as np
import pytest

from numformer import kernels
from numformer.decode import beam_candidates, greedy_pick
from numformer.kernels.decoding import top_n
from numformer.model import take_rows_

PAD, BOS, EOS = 0, 1, 2


def _expected_logp(logits, force):
    """log_softmax over the vocabulary, PAD and BOS at -inf, forced rows: only EOS, with its own value."""
    z = logits.astype(np.float64)
    logp = z - z.max(axis=-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
    logp[..., [PAD, BOS]] = -np.inf
    eos = logp[..., EOS].copy()
    logp[force] = -np.inf
    logp[..., EOS][force] = eos[force]
    return logp


@pytest.fixture(params=["fast", "plain"])
def mode(request):
    with kernels.kernel_mode(request.param):
        yield request.param


def test_beam_candidates_are_the_best_of_scores_plus_log_softmax(mode):
    rng = np.random.default_rng(0)
    m, k, v = 5, 3, 50
    logits = rng.standard_normal((m * k, v)) * 3
    scores = np.log(rng.uniform(0.01, 1, (m, k)))
    scores[1, 1:] = -np.inf  # a sentence at its first step: only beam 0 is live
    force = np.array([False, False, True, False, False])
    logp = _expected_logp(logits.reshape(m, k, v), force)
    cand = (scores[:, :, None] + logp).reshape(m, k * v)
    top, top_scores = kernels.kernel(beam_candidates)(logits.copy(), scores, 2 * k, PAD, BOS, EOS, force)
    expected = np.sort(cand, axis=1)[:, ::-1][:, : 2 * k]
    np.testing.assert_allclose(top_scores, expected, rtol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(cand, top, axis=1), top_scores, rtol=1e-12)  # indices match values
    assert set((top[2][np.isfinite(top_scores[2])] % v).tolist()) == {EOS}  # forced: only EOS is finite
    # forced EOS keeps the model's own log-probability: beam j's candidate is scores[j] + log p(EOS | beam j)
    forced = top_scores[2][np.isfinite(top_scores[2])]
    np.testing.assert_allclose(np.sort(forced), np.sort(scores[2] + logp[2, :, EOS]), rtol=1e-12)
    assert (forced < scores[2].max()).all()  # a free EOS (log p 0) would score scores[2] itself
    assert not np.isin(top % v, [PAD, BOS])[np.isfinite(top_scores)].any()  # -inf ones are mere filler


def test_greedy_pick_is_the_argmax_of_log_softmax(mode):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 40)) * 4
    logits[3, PAD] = 100.0  # padding would win without the ban
    force = np.array([False, True, False, False, False, True])
    logp = _expected_logp(logits, force)
    nxt, gained = kernels.kernel(greedy_pick)(logits.copy(), PAD, BOS, EOS, force)
    np.testing.assert_array_equal(nxt, logp.argmax(axis=1))
    np.testing.assert_allclose(gained, logp.max(axis=1), rtol=1e-12, atol=1e-12)
    assert (gained[force] < 0).all()  # the model's own EOS log-probability, not a free 0


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


def test_top_n_finds_the_largest_entries_of_each_row():
    rng = np.random.default_rng(3)
    for width in (32000, 4 * 37, 97):  # grouped (16 | 32000), a smaller divisor (4), prime: whole-row fallback
        a = rng.standard_normal((7, width)).astype(np.float32)
        a[0, :] = -np.inf        # a row of -inf (all beams dead) still yields n entries
        a[1, ::3] = 5.0          # ties at the top
        idx, vals = top_n(a, 8)
        np.testing.assert_array_equal(np.take_along_axis(a, idx, axis=1), vals)
        np.testing.assert_array_equal(np.sort(vals, axis=1), np.sort(a, axis=1)[:, -8:])
        assert all(len(set(row)) == 8 for row in idx.tolist())  # 8 distinct columns


def test_grouped_beam_step_equals_the_step_on_repeated_memory():
    """decode_step(beam=k) (one memory row per sentence) equals the plain step on memory repeated k times,
    across a beam permutation of the self-attention caches and a sentence leaving the batch."""
    from numformer.model import Transformer
    from numformer.presets import get_preset

    for pre_norm in (False, True):
        m = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, max_len=64,
                                   pre_norm=pre_norm), seed=1, dtype=np.float64).eval()
        k = 3
        src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]])
        memory, mask = m.encode(src)
        rep = np.repeat(np.arange(2), k)
        grouped, plain = m.new_decoder_caches(), m.new_decoder_caches()
        mem_p, mask_p = memory[rep], mask[rep]
        rng = np.random.default_rng(4)
        for t in range(6):
            rows = mem_p.shape[0]
            tokens = rng.integers(3, 30, rows)
            a = m.decode_step(tokens, memory, mask, grouped, position=t, beam=k)
            b = m.decode_step(tokens, mem_p, mask_p, plain, position=t)
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
            if t == 2:  # beams swap parents inside each sentence
                perm = np.array([1, 1, 0, 5, 3, 4])
                m.reorder_caches(grouped, perm, parts=("self",))
                m.reorder_caches(plain, perm)
            if t == 4:  # sentence 0 is done: only sentence 1's beams go on
                stay = np.array([1])
                m.reorder_caches(grouped, np.arange(3, 6), parts=("self",))
                m.reorder_caches(grouped, stay, parts=("cross",))
                m.reorder_caches(plain, np.arange(3, 6))
                memory, mask, mem_p, mask_p = memory[stay], mask[stay], mem_p[3:], mask_p[3:]
