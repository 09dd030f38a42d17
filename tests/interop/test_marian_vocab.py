"""numformer's Marian vocabulary turns text into the ids transformers' MarianTokenizer gives (source and target
side, pieces missing from vocab.json as <unk>, the special tokens' strings, a language code, unseen
characters) and target ids into its text; it travels inside the model file (``vocab/marian``) and stands
where numformer's SubwordVocab stands: ``load_model``, ``translate_lines``, the corpus encoder."""
import json
import random

import numpy as np
import pytest

pytest.importorskip("transformers")
from transformers import MarianTokenizer  # noqa: E402

from marian_files import DROPPED, SRC_WORDS, TGT_WORDS, sentences  # noqa: E402
from numformer.checkpoint import MARIAN_VOCAB_KEY, VOCAB_KEY, load_checkpoint  # noqa: E402
from numformer.checkpoint.trained_model import load_model  # noqa: E402
from numformer.data import DataError, SubwordVocab  # noqa: E402
from numformer.data.encoding import CachedEncoder  # noqa: E402
from numformer.data.marian_vocab import MarianVocab, vocab_from_bytes  # noqa: E402
from numformer.decoding.translation import DecodeOptions, translate_lines  # noqa: E402

ODD_LINES = ["", "  the  cat  ", "the bridge walks over the river", "the house is grün ünïcödé 你好",
             "the</s>cat <pad> dog<unk>x", ">>de<< the cat", "a >>de<< b", "<s> the", "der hund läuft schnell ."]


@pytest.fixture(scope="module")
def pair(tokenizer_dir):
    size = len(json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8")))
    return MarianTokenizer.from_pretrained(str(tokenizer_dir)), MarianVocab.from_files(tokenizer_dir, 0, size - 1)


def test_source_and_target_ids_equal_marian_tokenizer(pair):
    tok, vocab = pair
    lines = sentences(SRC_WORDS, 7, 30) + sentences(TGT_WORDS, 8, 30) + ODD_LINES
    source, target = vocab.encode_source(lines), vocab.encode_target(lines)
    for line, src, tgt in zip(lines, source, target):
        assert src + [vocab.eos_id] == tok(line)["input_ids"], line           # MarianTokenizer appends eos
        assert tgt + [vocab.eos_id] == tok(text_target=line)["input_ids"], line
    assert vocab.encode == vocab.encode_source
    assert source != target                                                   # the two models split apart
    dropped = vocab.encode_source(["the bridge walks"])[0]
    assert dropped.count(vocab.unk_id) == len(DROPPED)                        # pieces vocab.json lacks


def test_decode_equals_marian_tokenizer(pair):
    tok, vocab = pair
    r = random.Random(0)
    seqs = [[r.randrange(vocab.size) for _ in range(r.randint(0, 12))] for _ in range(300)]
    seqs += vocab.encode_target(sentences(TGT_WORDS, 9, 20))
    for seq in seqs:
        cut = seq[: seq.index(vocab.eos_id)] if vocab.eos_id in seq else seq   # numformer stops at eos
        assert vocab.decode([seq])[0] == tok.decode(cut, skip_special_tokens=True), seq
    lines = sentences(TGT_WORDS, 10, 20)
    assert vocab.decode(vocab.encode_target(lines)) == lines


def test_bytes_round_trip_and_kind(pair, tokenizer_dir):
    _, vocab = pair
    blob = vocab.to_bytes()
    again = vocab_from_bytes(blob)
    assert isinstance(again, MarianVocab) and again.to_bytes() == blob
    assert (again.size, again.pad_id, again.unk_id, again.bos_id, again.eos_id) == \
        (vocab.size, vocab.size - 1, 1, vocab.size - 1, 0)
    lines = sentences(SRC_WORDS, 11, 10) + ODD_LINES
    assert again.encode_source(lines) == vocab.encode_source(lines)
    with pytest.raises(DataError, match="damaged"):
        MarianVocab.from_bytes(blob[:-10])


def test_the_vocabulary_rides_in_the_model_file(marian):
    case = marian("relu")
    import zipfile

    names = zipfile.ZipFile(case.npz).namelist()
    assert f"{MARIAN_VOCAB_KEY}.npy" in names and f"{VOCAB_KEY}.npy" not in names
    model, vocab, _ = load_model(case.npz)
    assert isinstance(vocab, MarianVocab) and vocab.size == case.vocab_size and vocab.bos_id == vocab.pad_id
    out = translate_lines(model, vocab, ["the cat sat on the mat .", "", "green tree"], DecodeOptions(beam=2))
    assert len(out) == 3 and out[1] == "" and all(isinstance(t, str) for t in out)
    ck = load_checkpoint(case.npz)
    assert vocab_from_bytes(ck.vocab).to_bytes() == ck.vocab


def test_the_corpus_encoder_takes_each_side_with_its_model(pair):
    _, vocab = pair
    lines = sentences(SRC_WORDS + TGT_WORDS, 12, 50)
    for side, expected in (("src", vocab.encode_source(lines)), ("tgt", vocab.encode_target(lines))):
        flat, lengths = CachedEncoder(vocab, threads=1, side=side).encode(lines)
        assert np.array_equal(flat, np.concatenate([np.asarray(e) for e in expected]))
        assert lengths.tolist() == [len(e) for e in expected]


def test_subword_vocab_has_the_same_sides(reverse_model):
    _, vocab, lines = reverse_model
    assert isinstance(vocab, SubwordVocab)
    assert vocab.encode_source(lines) == vocab.encode_target(lines) == vocab.encode(lines)


def test_tokenizer_files_that_disagree_with_the_model_are_one_line(tokenizer_dir, tmp_path):
    size = len(json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8")))
    with pytest.raises(DataError, match="pad id is 3 but vocab.json"):
        MarianVocab.from_files(tokenizer_dir, 0, 3)
    with pytest.raises(DataError, match=f"has id {size - 1} but the model has {size - 1} vocabulary rows"):
        MarianVocab.from_files(tokenizer_dir, 0, size - 1, size=size - 1)
    pieces = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    del pieces["<unk>"]
    for name in ("source.spm", "target.spm"):
        (tmp_path / name).write_bytes((tokenizer_dir / name).read_bytes())
    (tmp_path / "vocab.json").write_text(json.dumps(pieces))
    with pytest.raises(DataError, match="no unk token"):
        MarianVocab.from_files(tmp_path, 0, size - 1)


def test_a_safetensors_export_carries_the_marian_vocabulary(marian, tmp_path):
    from numformer.checkpoint_command import main

    case = marian("relu")
    assert main(["export", str(case.npz), "--out", str(tmp_path / "m.safetensors")]) == 0
    _, vocab, _ = load_model(tmp_path / "m.safetensors")
    assert isinstance(vocab, MarianVocab) and vocab.to_bytes() == load_checkpoint(case.npz).vocab
