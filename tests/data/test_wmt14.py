"""The WMT 2014 corpora (numformer/data/wmt14.py): the two sources (a --wmt-dir tree of text files, the
datasets library's wmt14 schema), the training-pair filters and their counts, and the bad inputs:
missing and misaligned files, no network, a build interrupted half way."""
import json
import os

import pytest

from numformer.data import DataError, read_lines
from numformer.data.wmt14 import META, build_wmt_corpus, filter_reason
from support import save_wmt14_dataset

# Training pairs with one of each filtered kind, and their counts (the module docstring's filters).
TRAIN = [("the house is big", "das Haus ist groß"),
         ("", "leer"),                                               # empty: the source side
         ("a red book", "   "),                                      # empty: whitespace only
         (" ".join(["word"] * 251), " ".join(["Wort"] * 251)),       # long: 251 words a side
         ("one two", "eins zwei drei vier"),                         # ratio: 4 > 1.5 x 2
         ("science-fiction is fun", "Science-Fiction macht Spaß"),
         ("two  spaces\there", "zwei Leerzeichen hier")]             # kept, whitespace normalised
KEPT = [TRAIN[0], TRAIN[5], ("two spaces here", "zwei Leerzeichen hier")]
DROPPED = {"empty": 2, "long": 1, "ratio": 1}
VALID = [("good morning", "guten Morgen"), ("", "")]                 # newstest: kept whole, even empty
TEST = [("the dog runs", "der Hund läuft"), ("thank you", "danke"), ("yes", "ja")]


def write_text_tree(folder, src="en", tgt="de"):
    folder.mkdir(parents=True, exist_ok=True)
    for stem, pairs in (("train", TRAIN), ("newstest2013", VALID), ("newstest2014", TEST)):
        (folder / f"{stem}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (folder / f"{stem}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return folder


def write_saved_dataset(folder, src="en", tgt="de"):
    """The datasets library's wmt14 dataset (its schema and splits), saved as a user's local copy would be."""
    return save_wmt14_dataset(folder, {"train": TRAIN, "validation": VALID, "test": TEST}, src, tgt)


def corpus_pairs(folder, split):
    return list(zip(read_lines(folder / f"{split}.src"), read_lines(folder / f"{split}.tgt")))


def test_filter_reasons_follow_clean_corpus_n():
    assert filter_reason("a b", "c d e") is None                       # 1.5 exactly is kept
    assert filter_reason("a b", "c d e f") == "ratio"
    assert filter_reason(" ".join("x" * 250), " ".join("y" * 250)) is None
    assert filter_reason(" ".join("x" * 251), "y") == "long"          # long is said before ratio
    assert filter_reason("", "y") == "empty"


@pytest.mark.parametrize("kind", ["text", "datasets"])
def test_both_sources_give_the_same_filtered_corpus(tmp_path, kind):
    source = (write_text_tree(tmp_path / "wmt") if kind == "text" else write_saved_dataset(tmp_path / "wmt"))
    said = []
    folder = build_wmt_corpus("wmt14-en-de", source, cache_dir=tmp_path / "cache", log=said.append)
    assert corpus_pairs(folder, "train") == KEPT
    assert corpus_pairs(folder, "valid") == VALID and corpus_pairs(folder, "test") == TEST
    meta = json.loads((folder / META).read_text())
    assert meta["dropped"] == DROPPED and meta["read"]["train"] == len(TRAIN) and meta["pairs"]["train"] == len(KEPT)
    assert any("2 dropped as empty, 1 as longer than 250 words, 1 for a length ratio over 1.5" in line
               for line in said), said
    again = []
    assert build_wmt_corpus("wmt14-en-de", source, cache_dir=tmp_path / "cache", log=again.append) == folder
    assert len(again) == 1 and "built before" in again[0] and "2 dropped as empty" in again[0]


def test_the_datasets_library_is_asked_for_wmt14_and_its_language_pair(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    saved = write_saved_dataset(tmp_path / "hub", src="en", tgt="fr")
    asked = []

    def load_dataset(name, config):
        asked.append((name, config))
        return datasets.load_from_disk(str(saved))
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("numformer.data.wmt14._online", lambda: True)
    folder = build_wmt_corpus("wmt14-en-fr", cache_dir=tmp_path / "cache")
    assert asked == [("wmt/wmt14", "fr-en")]
    assert corpus_pairs(folder, "train") == KEPT
    assert json.loads((folder / META).read_text())["origin"] == "datasets:wmt/wmt14"


def test_a_missing_file_is_named_and_nothing_is_built(tmp_path):
    tree = write_text_tree(tmp_path / "wmt")
    (tree / "newstest2014.de").unlink()
    with pytest.raises(DataError, match=r"lacks newstest2014\.de"):
        build_wmt_corpus("wmt14-en-de", tree, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_misaligned_pair_of_files_is_refused_and_nothing_is_left(tmp_path):
    tree = write_text_tree(tmp_path / "wmt")
    with open(tree / "train.de", "a", encoding="utf-8") as f:
        f.write("eine Zeile zu viel\n")
    with pytest.raises(DataError, match=r"train\.de has more lines than .*train\.en \(which ends after line 7\)"):
        build_wmt_corpus("wmt14-en-de", tree, cache_dir=tmp_path / "cache")
    assert os.listdir(tmp_path) == ["wmt"]  # neither the corpus nor its half-built staging folder


def test_a_build_interrupted_half_way_leaves_nothing_and_the_next_starts_clean(tmp_path, monkeypatch):
    tree = write_text_tree(tmp_path / "wmt")
    real_write = open
    calls = []

    def dying_open(path, *args, **kwargs):  # Ctrl-C while the newstest2014 files are being written
        calls.append(str(path))
        if str(path).endswith("test.src") and "building" in str(path):
            raise KeyboardInterrupt
        return real_write(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", dying_open)
    with pytest.raises(KeyboardInterrupt):
        build_wmt_corpus("wmt14-en-de", tree, cache_dir=tmp_path / "cache")
    monkeypatch.undo()
    assert any(c.endswith("train.src") for c in calls) and os.listdir(tmp_path) == ["wmt"]
    folder = build_wmt_corpus("wmt14-en-de", tree, cache_dir=tmp_path / "cache")
    assert corpus_pairs(folder, "test") == TEST


def test_wmt_dir_is_only_for_the_wmt_corpora(tmp_path):
    from numformer.data.sources import resolve_source

    with pytest.raises(DataError, match="--wmt-dir gives the files of a WMT 2014 corpus"):
        resolve_source("bible-en-es", None, None, wmt_dir=tmp_path)
