"""The shared sentencepiece vocabulary."""

import numpy as np
import pytest

from numformer.data import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataError, SubwordVocab, default_vocab_size,
                            make_synthetic, normalize_line)

EN = [
    "In the beginning, God created the heavens and the earth.",
    "The earth was formless and empty.",
    "Darkness was on the surface of the deep.",
    "God said, “Let there be light,” and there was light.",
    "God saw the light, and saw that it was good.",
    "God divided the light from the darkness.",
    "God called the light “day”, and the darkness he called “night”.",
    "There was evening and there was morning, the first day.",
]
ES = [
    "En el principio creó Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía.",
    "Y las tinieblas estaban sobre la haz del abismo.",
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "Y vió Dios que la luz era buena.",
    "Y apartó Dios la luz de las tinieblas.",
    "Y llamó Dios á la luz Día, y á las tinieblas llamó Noche.",
    "Y fué la tarde y la mañana un día.",
]
# Repeat with variations so BPE has enough material for a few hundred merges.
CORPUS = [f"{line} {k}" for k in range(30) for line in EN + ES]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return SubwordVocab.train(CORPUS, tmp_path_factory.mktemp("spm") / "shared", vocab_size=200)


def test_special_ids_are_fixed(vocab):
    assert (vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2, 3)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert [vocab.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert vocab.size == len(vocab) == 200
    assert vocab.requested_size == 200


def test_encode_adds_no_specials_and_round_trips(vocab):
    ids = vocab.encode(EN + ES)
    assert len(ids) == len(EN + ES)
    for seq in ids:
        assert seq and all(isinstance(t, int) for t in seq)
        assert not {PAD_ID, BOS_ID, EOS_ID} & set(seq)
        assert all(0 <= t < vocab.size for t in seq)
    assert vocab.decode(ids) == EN + ES


def test_round_trip_of_unseen_sentences_made_of_seen_characters(vocab):
    lines = ["  the   light\tand the   darkness  ", "la luz de Dios, la tierra y el día."]
    assert vocab.decode(vocab.encode([normalize_line(x) for x in lines])) == [normalize_line(x) for x in lines]


def test_unseen_character_becomes_unk(vocab):
    ids = vocab.encode(["the Ω light"])[0]
    assert UNK_ID in ids


def test_byte_fallback_round_trips_unseen_characters(tmp_path):
    v = SubwordVocab.train(CORPUS, tmp_path / "bf", vocab_size=400, byte_fallback=True)
    assert v.decode(v.encode(["the Ω light ✓"])) == ["the Ω light ✓"]


def test_decode_stops_at_eos_and_skips_pad_and_bos(vocab):
    body = vocab.encode(["God saw the light"])[0]
    row = [BOS_ID] + body + [EOS_ID] + vocab.encode(["garbage after eos"])[0] + [PAD_ID, PAD_ID]
    assert vocab.decode([row]) == ["God saw the light"]
    # A padded 2-D array, as a decoder returns it.
    other = vocab.encode(["la luz"])[0]
    width = len(body) + 3
    arr = np.full((2, width), PAD_ID, dtype=np.int64)
    arr[0, : len(body) + 1] = body + [EOS_ID]
    arr[1, : len(other) + 2] = [BOS_ID] + other + [EOS_ID]
    assert vocab.decode(arr) == ["God saw the light", "la luz"]
    assert vocab.decode([[PAD_ID, PAD_ID]]) == [""]
    with pytest.raises(TypeError):
        vocab.decode(np.array(body))
    with pytest.raises(TypeError):
        vocab.encode("one string")


def test_training_is_deterministic(tmp_path):
    a = SubwordVocab.train(CORPUS, tmp_path / "a", vocab_size=150)
    b = SubwordVocab.train(CORPUS, tmp_path / "b", vocab_size=150)
    # The .model bytes embed the output path, so compare the pieces and
    # their scores (the .vocab files) instead.
    assert [a.id_to_piece(i) for i in range(a.size)] == [b.id_to_piece(i) for i in range(b.size)]
    assert (tmp_path / "a.vocab").read_text(encoding="utf-8") == (tmp_path / "b.vocab").read_text(encoding="utf-8")
    assert a.encode(CORPUS) == b.encode(CORPUS)


def test_too_large_vocab_is_capped_to_what_the_data_allows(tmp_path):
    data = make_synthetic("copy", 300, 0, 0, seed=0, vocab="abcdefgh")
    lines = data["train"][0] + data["train"][1]
    v = SubwordVocab.train(lines, tmp_path / "syn", vocab_size=5000)
    assert v.requested_size == 5000
    assert 4 + 8 < v.size < 5000
    assert v.decode(v.encode(lines[:20])) == lines[:20]


def test_training_is_quiet(tmp_path, capfd):
    SubwordVocab.train(CORPUS, tmp_path / "q", vocab_size=120)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_load_save_bytes_round_trip(vocab, tmp_path):
    again = SubwordVocab.load(vocab.path)
    saved = SubwordVocab.load(vocab.save(tmp_path / "copy" / "m.model"))
    from_bytes = SubwordVocab.from_bytes(vocab.to_bytes())
    for v in (again, saved, from_bytes):
        assert v.size == vocab.size
        assert v.encode(EN) == vocab.encode(EN)
    assert vocab.piece_to_id("<pad>") == PAD_ID
    assert "SubwordVocab(size=200" in repr(vocab)


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        SubwordVocab.load(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a sentencepiece model"):
        SubwordVocab.load(tmp_path / "junk.model")


def test_train_errors(tmp_path):
    with pytest.raises(DataError, match="no non-empty line"):
        SubwordVocab.train(["", "   "], tmp_path / "e", vocab_size=100)
    with pytest.raises(DataError, match="too small"):
        SubwordVocab.train(CORPUS, tmp_path / "s", vocab_size=4)


def test_train_accepts_an_iterator_and_defaults_the_size(tmp_path):
    v = SubwordVocab.train(iter(CORPUS), tmp_path / "it")
    # 480 lines = 240 pairs -> default 72; the small corpus supports that.
    assert v.requested_size == default_vocab_size(len(CORPUS) // 2) == 72
    assert v.size == 72


def test_default_vocab_size():
    assert default_vocab_size(28_000) == 8000
    assert default_vocab_size(60_000) == 8000
    assert default_vocab_size(0) == 64 and default_vocab_size(100) == 64
    assert default_vocab_size(1000) == 304
    assert default_vocab_size(4_500_000) == 32000
    sizes = [default_vocab_size(n) for n in (10, 1000, 5000, 20_000, 28_000, 200_000, 10**6, 10**8)]
    assert sizes == sorted(sizes)
    assert all(s % 8 == 0 and s >= 64 for s in sizes)
