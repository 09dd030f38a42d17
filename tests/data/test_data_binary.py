"""The binary dataset's pieces: .npy files written in chunks, pairs gathered from flat arrays, batch plans
from lengths alone (the same batches as the pair-by-pair cut), streamed lines, the word-cached encoder."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numformer.data import DataError, SubwordVocab, TokenPairs, plan_batches, read_lines
from numformer.data.binary import NpyAppender
from numformer.data.encoding import CachedEncoder
from numformer.data.text_files import count_lines, iter_line_blocks

PAD, BOS, EOS = 0, 2, 3


def random_pairs(rng, n, longest=30):
    src = [rng.integers(4, 60, size=int(rng.integers(0, longest))).tolist() for _ in range(n)]
    tgt = [rng.integers(4, 60, size=int(rng.integers(0, longest))).tolist() for _ in range(n)]
    return src, tgt


def greedy_reference(src_len, tgt_len, max_tokens, seed, epoch, max_len):
    """The cut as a loop over pairs (what batching did before plans): lists of pair indices."""
    n = len(src_len)
    keep = np.arange(n) if max_len is None else np.flatnonzero((src_len + 1 <= max_len) & (tgt_len + 1 <= max_len))
    s, t = src_len[keep] + 1, tgt_len[keep] + 1
    rng = np.random.default_rng([seed, epoch]) if seed is not None else None
    perm = rng.permutation(keep.size) if rng is not None else np.arange(keep.size)
    order = perm[np.lexsort((t[perm], s[perm]))]
    groups, start, max_s, max_t = [], 0, 0, 0
    for pos, k in enumerate(order):
        new_s, new_t = max(max_s, s[k]), max(max_t, t[k])
        if pos > start and (pos - start + 1) * (new_s + new_t) > max_tokens:
            groups.append(order[start:pos])
            start, max_s, max_t = pos, s[k], t[k]
        else:
            max_s, max_t = new_s, new_t
    if keep.size:
        groups.append(order[start:])
    if rng is not None:
        groups = [groups[g] for g in rng.permutation(len(groups))]
    return [keep[g].tolist() for g in groups]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), max_tokens=st.integers(1, 900), seed=st.sampled_from([None, 0, 7]),
       epoch=st.integers(0, 3), max_len=st.sampled_from([None, 5, 20]), data_seed=st.integers(0, 10 ** 6))
def test_plan_cuts_the_same_batches_as_the_pair_by_pair_loop(n, max_tokens, seed, epoch, max_len, data_seed):
    rng = np.random.default_rng(data_seed)
    src_len, tgt_len = rng.integers(0, 40, n), rng.integers(0, 40, n)
    plan = plan_batches(src_len, tgt_len, max_tokens, seed, epoch, max_len)
    assert [plan[i].tolist() for i in range(len(plan))] == greedy_reference(src_len, tgt_len, max_tokens, seed,
                                                                            epoch, max_len)
    assert plan.n_pairs + plan.n_filtered == n


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 400), seed=st.sampled_from([None, 3]), longest=st.sampled_from([300, 70_000]),
       data_seed=st.integers(0, 10 ** 6))
def test_plan_of_long_sentences_cuts_the_same_batches_as_the_pair_by_pair_loop(n, seed, longest, data_seed):
    # lengths past 256 a side: the sort key no longer fits 16 bits (int32, then int64 past 46,340)
    rng = np.random.default_rng(data_seed)
    src_len, tgt_len = rng.integers(0, longest, n), rng.integers(0, longest, n)
    max_tokens = int(rng.integers(1, 4 * longest))
    plan = plan_batches(src_len, tgt_len, max_tokens, seed, 1)
    assert [plan[i].tolist() for i in range(len(plan))] == greedy_reference(src_len, tgt_len, max_tokens, seed, 1,
                                                                            None)


def test_lengths_of_a_mapped_dataset_are_read_in_blocks_without_an_int64_copy(tmp_path):
    rng = np.random.default_rng(2)
    for side in ("src", "tgt"):
        offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 90, 2_500_000))]).astype(np.int64)
        np.save(tmp_path / f"train.{side}.offsets.npy", offsets)
        np.save(tmp_path / f"train.{side}.ids.npy", np.zeros(int(offsets[-1]), np.uint16))
    pairs = TokenPairs.open(tmp_path, "train")
    src_len, tgt_len = pairs.lengths
    assert src_len.dtype == np.int32 and tgt_len.dtype == np.int32
    assert np.array_equal(src_len, np.diff(np.load(tmp_path / "train.src.offsets.npy")))  # across 1M-pair blocks
    assert np.array_equal(tgt_len, np.diff(np.load(tmp_path / "train.tgt.offsets.npy")))


def test_plan_uses_four_bytes_per_pair():
    rng = np.random.default_rng(0)
    plan = plan_batches(rng.integers(1, 50, 10_000), rng.integers(1, 50, 10_000), 3000, shuffle_seed=1)
    assert plan.order.dtype == np.int32 and plan.order.size == 10_000 and plan.starts[-1] == 10_000
    assert sorted(plan.order.tolist()) == list(range(10_000))  # every pair once
    with pytest.raises(IndexError):
        plan[len(plan)]


def padded(rows, prefix=None, suffix=None):
    """Lists of ids -> the right-padded array a batch must hold, written out row by row."""
    rows = [([prefix] if prefix is not None else []) + r + ([suffix] if suffix is not None else []) for r in rows]
    out = np.full((len(rows), max(map(len, rows))), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def test_a_batch_gathered_from_flat_arrays_equals_padding_the_lists():
    rng = np.random.default_rng(1)
    src, tgt = random_pairs(rng, 50)
    pairs = TokenPairs.from_lists(src, tgt)
    index = np.array([7, 3, 49, 0, 12])
    b = pairs.batch(index, PAD, BOS, EOS)
    assert np.array_equal(b.src, padded([src[i] for i in index], suffix=EOS))
    assert np.array_equal(b.tgt_in, padded([tgt[i] for i in index], prefix=BOS))
    assert np.array_equal(b.tgt_out, padded([tgt[i] for i in index], suffix=EOS))
    assert b.n_src_tokens == sum(len(src[i]) + 1 for i in index) and b.n_tgt_tokens == int((b.tgt_out != PAD).sum())
    assert b.index.tolist() == index.tolist()
    assert pairs.side_lists("tgt") == tgt and [len(s) for s in src] == pairs.lengths[0].tolist()


def test_npy_written_in_chunks_opens_memory_mapped(tmp_path):
    path = tmp_path / "x.ids.npy"
    w = NpyAppender(path, np.uint16)
    chunks = [np.arange(5), np.zeros(0), np.arange(70_000) % 65_536]
    for c in chunks:
        w.append(c)
    assert not path.exists()  # written under a temporary name until closed
    w.close()
    got = np.load(path, mmap_mode="r")
    assert isinstance(got, np.memmap) and got.dtype == np.uint16
    assert np.array_equal(got, np.concatenate(chunks).astype(np.uint16))
    assert list(tmp_path.iterdir()) == [path]


def test_npy_appender_aborted_leaves_nothing(tmp_path):
    w = NpyAppender(tmp_path / "a.npy", np.int64)
    w.append(np.arange(3))
    w.abort()
    with pytest.raises(KeyError):
        with NpyAppender(tmp_path / "b.npy", np.int64) as w:
            w.append(np.arange(3))
            raise KeyError("stop")
    assert list(tmp_path.iterdir()) == []
    with NpyAppender(tmp_path / "c.npy", np.int64) as w:
        w.append(np.arange(3))
    assert np.load(tmp_path / "c.npy").tolist() == [0, 1, 2] and list(tmp_path.iterdir()) == [tmp_path / "c.npy"]


def test_pairs_open_memory_mapped_and_gather_the_rows(tmp_path):
    rng = np.random.default_rng(4)
    src, tgt = random_pairs(rng, 40)
    mem = TokenPairs.from_lists(src, tgt)
    for side, (ids, off) in (("src", (mem.src_ids, mem.src_offsets)), ("tgt", (mem.tgt_ids, mem.tgt_offsets))):
        np.save(tmp_path / f"train.{side}.ids.npy", ids.astype(np.uint16))
        np.save(tmp_path / f"train.{side}.offsets.npy", off)
    mapped = TokenPairs.open(tmp_path, "train")
    assert isinstance(mapped.src_ids, np.memmap) and len(mapped) == 40
    index = np.array([39, 0, 5])
    a, b = mapped.batch(index, PAD, BOS, EOS), mem.batch(index, PAD, BOS, EOS)
    assert np.array_equal(a.src, b.src) and np.array_equal(a.tgt_in, b.tgt_in) and a.src.dtype == np.int64
    with pytest.raises(DataError, match="prepare the corpus again"):
        TokenPairs.open(tmp_path, "valid")


LINES = [b"", b"\xef\xbb\xbf", b"\xef\xbb\xbfone\n", b"a", b"a\n\n", b"a  \t b\r\nc\n\n d", b"x" * 50 + b"\n" + b"y\n" * 3,
         b"one\n\xef\xbb\xbftwo\n"]


@pytest.mark.parametrize("data", LINES)
def test_streamed_lines_equal_read_lines(data, tmp_path):
    path = tmp_path / "f.src"
    path.write_bytes(data)
    expected = read_lines(path)
    for block in (1, 2, 5, 1 << 20):
        blocks = list(iter_line_blocks(path, block))
        assert [line for _, lines in blocks for line in lines] == expected, block
        assert [done for done, _ in blocks] == np.cumsum([0] + [len(ls) for _, ls in blocks])[:-1].tolist()
    assert count_lines(path) == len(expected)


def test_a_bad_byte_in_a_later_block_names_its_line(tmp_path):
    path = tmp_path / "train.src"
    path.write_bytes(b"ok\n" * 40 + b"caf\xe9\nok\n")
    with pytest.raises(DataError, match=r"train\.src line 41 is not valid UTF-8 \(byte 0xe9 at byte column 4\)"):
        list(iter_line_blocks(path, 16))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    rng = np.random.default_rng(5)
    words = [f"w{i}x{'abcdefgh'[i % 8] * (i % 5)}" for i in range(400)]
    text = [" ".join(rng.choice(words, size=int(rng.integers(1, 20)))) for _ in range(2000)]
    return SubwordVocab.train(text, tmp_path_factory.mktemp("spm") / "spm", 300)


def test_the_word_cache_encodes_as_sentencepiece_does(vocab):
    rng = np.random.default_rng(6)
    words = [f"w{i}x{'abcdefgh'[i % 8] * (i % 5)}" for i in range(600)] + ["éü", "ñaña", "zz", "日本"]
    lines = [" ".join(rng.choice(words, size=int(rng.integers(0, 25)))) for _ in range(3000)]
    lines[:3] = ["", "日本 ok", "w1x"]
    enc = CachedEncoder(vocab, threads=1, max_words=300)  # small: the cache also starts afresh on the way
    flat, lengths = enc.encode(lines[:1500])
    flat2, lengths2 = enc.encode(lines[1500:])
    assert enc.exact_words
    expected = vocab.encode(lines)
    assert np.concatenate([lengths, lengths2]).tolist() == [len(e) for e in expected]
    assert np.concatenate([flat, flat2]).tolist() == [t for e in expected for t in e]


def test_the_encoder_falls_back_to_sentencepiece_when_the_check_fails(vocab, monkeypatch):
    lines = ["w1x w2xa", "w3xbb w1x", ""]
    enc = CachedEncoder(vocab, threads=1)
    monkeypatch.setattr(enc, "_by_words", lambda lines: (np.zeros(1, np.int32), np.ones(len(lines), np.int64)))
    flat, lengths = enc.encode(lines)
    assert not enc.exact_words
    assert lengths.tolist() == [len(e) for e in vocab.encode(lines)]
    assert flat.tolist() == [t for e in vocab.encode(lines) for t in e]
