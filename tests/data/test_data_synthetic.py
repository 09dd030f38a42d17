"""Synthetic copy / reverse corpora."""

import pytest

from numformer.data import DataError, SYNTHETIC_TASKS, make_synthetic


def test_copy_targets_equal_sources():
    data = make_synthetic("copy", 200, 20, 30, seed=1)
    assert [len(data[s][0]) for s in ("train", "valid", "test")] == [200, 20, 30]
    for src, tgt in data.values():
        assert src == tgt


def test_reverse_targets_are_reversed_sources():
    data = make_synthetic("reverse", 100, 10, 10, seed=2, min_len=2, max_len=6)
    for src, tgt in data.values():
        assert len(src) == len(tgt)
        for s, t in zip(src, tgt):
            assert t.split() == s.split()[::-1]


def test_lengths_and_symbols_respect_arguments():
    vocab = ["red", "green", "blue", "x1"]
    data = make_synthetic("copy", 300, 0, 0, seed=3, vocab=vocab, min_len=4, max_len=7)
    src = data["train"][0]
    lengths = {len(s.split()) for s in src}
    assert lengths <= set(range(4, 8)) and len(lengths) == 4  # every length occurs
    assert {tok for s in src for tok in s.split()} <= set(vocab)
    for s in src:
        assert s == " ".join(s.split())  # single spaces, no padding


def test_deterministic_for_a_seed_and_different_across_seeds():
    a = make_synthetic("reverse", 50, 5, 5, seed=7)
    b = make_synthetic("reverse", 50, 5, 5, seed=7)
    c = make_synthetic("reverse", 50, 5, 5, seed=8)
    assert a == b
    assert a["train"] != c["train"]


def test_sentences_are_distinct_across_splits():
    # 3 symbols, lengths 1-3: 39 possible sentences; ask for 19 (about half).
    data = make_synthetic("copy", 12, 4, 3, seed=0, vocab="abc", min_len=1, max_len=3)
    everything = data["train"][0] + data["valid"][0] + data["test"][0]
    assert len(everything) == 19 == len(set(everything))


def test_errors():
    with pytest.raises(DataError, match="unknown synthetic task 'sort'.*copy, reverse"):
        make_synthetic("sort", 10, 1, 1, seed=0)
    with pytest.raises(DataError, match="min_len"):
        make_synthetic("copy", 10, 1, 1, seed=0, min_len=5, max_len=4)
    with pytest.raises(DataError, match="min_len"):
        make_synthetic("copy", 10, 1, 1, seed=0, min_len=0)
    with pytest.raises(DataError, match="distinct sentences"):
        make_synthetic("copy", 100, 0, 0, seed=0, vocab="ab", min_len=1, max_len=3)
    with pytest.raises(DataError, match="whitespace"):
        make_synthetic("copy", 10, 0, 0, seed=0, vocab=["a b", "c"])
    with pytest.raises(DataError, match="empty"):
        make_synthetic("copy", 10, 0, 0, seed=0, vocab=[])
    with pytest.raises(DataError, match="n_train"):
        make_synthetic("copy", 0, 1, 1, seed=0)
    with pytest.raises(DataError, match="n_valid"):
        make_synthetic("copy", 5, -1, 1, seed=0)


def test_tasks_listed():
    assert set(SYNTHETIC_TASKS) == {"copy", "reverse"}
