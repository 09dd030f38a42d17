"""Token-bounded, length-sorted batching: plan_batches cuts the pairs, TokenPairs.batch builds each batch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numformer.data import Batch, DataError, TokenPairs, pad_rows, plan_batches

PAD, BOS, EOS = 0, 2, 3


def cut(src, tgt, max_tokens, pad_id=PAD, bos_id=BOS, eos_id=EOS, **plan):
    """The batches training builds from these pairs: (the plan, every batch gathered)."""
    pairs = TokenPairs.from_lists(src, tgt)
    cut = plan_batches(*pairs.lengths, max_tokens, **plan)
    return cut, [pairs.batch(cut[i], pad_id, bos_id, eos_id) for i in range(len(cut))]


def random_pairs(n, seed=0, max_len=40, vocab=50):
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, vocab, size=rng.integers(0, max_len + 1))) for _ in range(n)]
    # Target lengths correlate with source lengths, as in translation.
    tgt = [list(rng.integers(4, vocab, size=max(0, len(s) + int(rng.integers(-3, 4))))) for s in src]
    return src, tgt


def check_batch(b, src, tgt, max_tokens):
    """Every array of b is exactly what the docstring promises."""
    B, S = b.src.shape
    assert b.tgt_in.shape == b.tgt_out.shape and b.tgt_in.shape[0] == B == b.index.shape[0]
    for arr in (b.src, b.tgt_in, b.tgt_out, b.index):
        assert arr.dtype == np.int64
    T = b.tgt_in.shape[1]
    assert B == 1 or B * (S + T) <= max_tokens
    assert b.n_padded_tokens == B * (S + T) and b.size == B
    n_src = n_tgt = 0
    for row, i in enumerate(b.index):
        s, t = src[i], tgt[i]
        assert list(b.src[row, : len(s)]) == s and b.src[row, len(s)] == EOS
        assert (b.src[row, len(s) + 1:] == PAD).all()
        assert b.tgt_in[row, 0] == BOS and list(b.tgt_in[row, 1: len(t) + 1]) == t
        assert (b.tgt_in[row, len(t) + 1:] == PAD).all()
        assert list(b.tgt_out[row, : len(t)]) == t and b.tgt_out[row, len(t)] == EOS
        assert (b.tgt_out[row, len(t) + 1:] == PAD).all()
        n_src += len(s) + 1
        n_tgt += len(t) + 1
    # No all-padding column: S and T are the longest lengths, not more.
    assert (b.src[:, -1] != PAD).any() and (b.tgt_out[:, -1] != PAD).any()
    assert b.n_src_tokens == n_src == int((b.src != PAD).sum())
    assert b.n_tgt_tokens == n_tgt == int((b.tgt_out != PAD).sum())


@pytest.mark.parametrize("max_tokens", [60, 500, 2500])
@pytest.mark.parametrize("seed", [None, 5])
def test_batches_respect_budget_and_cover_every_pair_once(max_tokens, seed):
    src, tgt = random_pairs(700, seed=1)
    plan, batches = cut(src, tgt, max_tokens, shuffle_seed=seed, epoch=3)
    assert plan.n_filtered == 0 and plan.n_pairs == 700
    seen = np.concatenate([b.index for b in batches])
    assert sorted(seen.tolist()) == list(range(700))
    for b in batches:
        assert isinstance(b, Batch)
        check_batch(b, src, tgt, max_tokens)


def test_batches_are_full_and_padding_is_small():
    src, tgt = random_pairs(3000, seed=2)
    batches = cut(src, tgt, 2000, shuffle_seed=0)[1]
    padded = sum(b.n_padded_tokens for b in batches)
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    # Length sorting keeps padding small.
    assert real / padded > 0.85
    # Greedy filling: on average batches use most of the budget.
    assert padded / len(batches) > 0.8 * 2000


def test_without_seed_batches_follow_length_order():
    src, tgt = random_pairs(400, seed=3)
    batches = cut(src, tgt, 300)[1]
    keys = [(len(src[i]), len(tgt[i])) for b in batches for i in b.index]
    assert keys == sorted(keys)
    # Ties keep input order when no seed is given.
    order = [int(i) for b in batches for i in b.index]
    for a, c in zip(order, order[1:]):
        if (len(src[a]), len(tgt[a])) == (len(src[c]), len(tgt[c])):
            assert a < c


def signature(batches):
    return [tuple(b.index.tolist()) for b in batches]


def test_shuffle_is_deterministic_per_seed_and_epoch():
    src, tgt = random_pairs(800, seed=4, max_len=12)  # many length ties
    a = cut(src, tgt, 400, shuffle_seed=11, epoch=0)[1]
    b = cut(src, tgt, 400, shuffle_seed=11, epoch=0)[1]
    assert signature(a) == signature(b)
    for x, y in zip(a, b):
        assert np.array_equal(x.src, y.src) and np.array_equal(x.tgt_out, y.tgt_out)
    c = cut(src, tgt, 400, shuffle_seed=11, epoch=1)[1]
    d = cut(src, tgt, 400, shuffle_seed=12, epoch=0)[1]
    assert signature(c) != signature(a) and signature(d) != signature(a)
    # Not only the order of batches changes: their contents do too.
    assert set(map(frozenset, signature(c))) != set(map(frozenset, signature(a)))
    # The batch order is shuffled, not sorted by length.
    first_src_len = [b.src.shape[1] for b in a]
    assert first_src_len != sorted(first_src_len)


def test_max_len_filters_and_counts():
    src, tgt = random_pairs(500, seed=5, max_len=30)
    max_len = 20
    expected_keep = [i for i in range(500) if len(src[i]) + 1 <= max_len and len(tgt[i]) + 1 <= max_len]
    n_out = 500 - len(expected_keep)
    assert n_out > 0
    plan, batches = cut(src, tgt, 400, shuffle_seed=1, max_len=max_len)
    assert plan.n_filtered == n_out and plan.n_pairs == len(expected_keep)
    seen = sorted(int(i) for b in batches for i in b.index)
    assert seen == expected_keep
    for b in batches:
        assert b.src.shape[1] <= max_len and b.tgt_in.shape[1] <= max_len
        check_batch(b, src, tgt, 400)
    with pytest.raises(DataError, match="max_len"):
        cut(src, tgt, 400, max_len=0)


def test_everything_filtered_gives_empty_list():
    plan, batches = cut([[5, 6, 7]], [[8, 9]], 100, max_len=2)
    assert batches == [] and plan.n_filtered == 1 and plan.n_pairs == 0


def test_oversized_pair_gets_its_own_batch():
    src = [[5] * 3, [6] * 50, [7] * 4]
    tgt = [[5] * 3, [6] * 60, [7] * 4]
    batches = cut(src, tgt, 40)[1]
    big = [b for b in batches if 1 in b.index.tolist()]
    assert len(big) == 1 and big[0].size == 1 and big[0].n_padded_tokens == 51 + 61
    assert sorted(int(i) for b in batches for i in b.index) == [0, 1, 2]


def test_empty_sequences_and_numpy_inputs():
    src = [np.array([], dtype=np.int64), np.array([9, 8])]
    tgt = [np.array([7]), np.array([], dtype=np.int32)]
    (b,) = cut(src, tgt, 100)[1]
    check_batch(b, [list(s) for s in src], [list(t) for t in tgt], 100)


def test_other_special_ids():
    (b,) = cut([[10, 11]], [[12]], 100, pad_id=7, bos_id=8, eos_id=9)[1]
    assert b.src.tolist() == [[10, 11, 9]]
    assert b.tgt_in.tolist() == [[8, 12]] and b.tgt_out.tolist() == [[12, 9]]


def test_a_start_equal_to_pad():
    """Marian's ids (eos 0, pad V - 1) and its decoder start, pad itself (bos == pad): the start column is pad, the
    token counts come from the lengths (not from != pad), so the start is not counted and every eos is."""
    (b,) = cut([[10, 11], [12]], [[13], []], 100, pad_id=99, bos_id=99, eos_id=0)[1]
    assert b.src.tolist() == [[12, 0, 99], [10, 11, 0]]  # shortest source first
    assert b.tgt_in.tolist() == [[99, 99], [99, 13]] and b.tgt_out.tolist() == [[0, 99], [13, 0]]
    assert (b.n_src_tokens, b.n_tgt_tokens) == (5, 3) == (int((b.src != 99).sum()), int((b.tgt_out != 99).sum()))


def test_teacher_forcing_shift():
    src, tgt = random_pairs(100, seed=6)
    for b in cut(src, tgt, 500, shuffle_seed=0)[1]:
        # tgt_out is tgt_in shifted left by one wherever tgt_in is not padding.
        inner = b.tgt_in[:, 1:]
        mask = inner != PAD
        assert np.array_equal(inner[mask], b.tgt_out[:, :-1][mask])


def test_errors():
    with pytest.raises(DataError, match="2 source sequences but 1 target"):
        TokenPairs.from_lists([[1], [2]], [[1]])
    with pytest.raises(DataError, match="2 source sequences but 1 target"):
        plan_batches([1, 2], [1], 100)
    with pytest.raises(DataError, match="max_tokens"):
        cut([[1]], [[1]], 0)


def test_pad_rows():
    out = pad_rows(np.array([4, 5, 6]), np.array([2, 0, 1]), pad_id=0, prefix=2, suffix=3)
    assert out.tolist() == [[2, 4, 5, 3], [2, 3, 0, 0], [2, 6, 3, 0]]
    assert pad_rows(np.array([4, 5, 6]), np.array([2, 1]), pad_id=9).tolist() == [[4, 5], [6, 9]]
    assert pad_rows(np.zeros(0, dtype=np.int64), np.array([0, 0]), pad_id=0).shape == (2, 1)
    assert pad_rows(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), pad_id=0).shape == (0, 1)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=60),
    max_tokens=st.integers(1, 400),
    seed=st.one_of(st.none(), st.integers(0, 2**31)),
    epoch=st.integers(0, 5),
)
def test_property_partition_and_budget(lengths, max_tokens, seed, epoch):
    src = [[4 + (k % 7)] * a for k, (a, _) in enumerate(lengths)]
    tgt = [[5 + (k % 5)] * b for k, (_, b) in enumerate(lengths)]
    batches = cut(src, tgt, max_tokens, shuffle_seed=seed, epoch=epoch)[1]
    assert sorted(int(i) for b in batches for i in b.index) == list(range(len(src)))
    for b in batches:
        check_batch(b, src, tgt, max_tokens)
