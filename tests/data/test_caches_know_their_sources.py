"""Caches that know their sources (numformer/data/source_fingerprint.py): a corpus built from a user's files
records each file's path, size and modification time, and is built again when one changed, with one log
line naming it: the WMT corpus from --wmt-dir (text files or a datasets save_to_disk folder), the run's
prepared corpus (a --data folder and the WMT corpus's own files), the bible corpus from its SWORD modules.
At 2de5030 the WMT corpus compared only its folder's path and trained on the old text."""
import json
import os

import pytest

from numformer.data import bible, read_lines
from numformer.data.prepared_dataset import prepare
from numformer.run_file_names import PREPARED

WORDS = ("house", "tree", "river", "stone", "light", "water", "road", "bread", "field", "bird")
WOERTER = ("Haus", "Baum", "Fluss", "Stein", "Licht", "Wasser", "Weg", "Brot", "Feld", "Vogel")
HOUR_NS = 3600 * 10**9


def sentences(words, n, offset=0):
    return [" ".join(words[(i + k + offset) % len(words)] for k in range(3 + i % 4)) for i in range(n)]


def age(paths):
    """Date the files an hour back: an edit made now gets another modification time even where the
    clock the file system stamps with is coarse (what an edit made minutes after the build has)."""
    for p in paths:
        t = p.stat().st_mtime_ns - HOUR_NS
        os.utime(p, ns=(t, t))


def write_wmt_tree(folder):
    """A --wmt-dir tree in the mirrors' layout: train, newstest2013, newstest2014 in English and German."""
    folder.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", 40), ("newstest2013", 5), ("newstest2014", 5)):
        (folder / f"{stem}.en").write_text("".join(s + "\n" for s in sentences(WORDS, n)), encoding="utf-8")
        (folder / f"{stem}.de").write_text("".join(s + "\n" for s in sentences(WOERTER, n)), encoding="utf-8")
    age(folder.iterdir())
    return folder


def prepare_wmt(tmp_path, wmt_dir, said):
    return prepare(tmp_path / "run", corpus="wmt14-en-de", wmt_dir=wmt_dir, vocab_size=60, seed=1,
                   log=said.append)


def train_targets(data):
    return data.vocab.decode(data.ids["train"].side_lists("tgt"))


def test_an_edited_wmt_dir_file_rebuilds_the_corpus_and_the_log_line_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path / "cache"))
    tree = write_wmt_tree(tmp_path / "wmt")
    said = []
    first = prepare_wmt(tmp_path, tree, said)
    assert "Haus Baum Fluss" in train_targets(first)[0]

    # Same size, other content: only the modification time tells.
    text = (tree / "train.de").read_text(encoding="utf-8")
    edited = text.replace("Haus", "Hans")
    assert len(edited.encode()) == len(text.encode()) and edited != text
    (tree / "train.de").write_text(edited, encoding="utf-8")
    said = []
    second = prepare_wmt(tmp_path, tree, said)
    assert not second.reused
    corpus = tmp_path / "cache" / "wmt14-en-de"
    assert read_lines(corpus / "train.tgt")[0].startswith("Hans Baum Fluss")
    assert train_targets(second)[0].startswith("Hans Baum Fluss")  # what training reads: the new text
    rebuilt = [line for line in said if "building it again" in line]
    assert len(rebuilt) == 1, said
    assert f"{tree.resolve() / 'train.de'} was modified (same size" in rebuilt[0]
    assert any(line.startswith(f"{corpus.resolve()}/train.") and "preparing it again" in line  # the run's line
               for line in said), "\n".join(said)

    # Another size.
    with open(tree / "newstest2014.en", "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with open(tree / "newstest2014.de", "a", encoding="utf-8") as f:
        f.write("noch eine Zeile\n")
    said = []
    third = prepare_wmt(tmp_path, tree, said)
    assert not third.reused and len(third.ids["test"]) == 6
    assert third.text["test"][1][-1] == "noch eine Zeile"
    rebuilt = [line for line in said if "building it again" in line]
    assert len(rebuilt) == 1 and f"{tree.resolve()}/newstest2014." in rebuilt[0] and "changed size (" in rebuilt[0], said

    # Nothing changed: reused as it is.
    said = []
    assert prepare_wmt(tmp_path, tree, said).reused
    assert not any("again" in line for line in said), said


def test_without_wmt_dir_an_edited_source_rebuilds_from_it_and_a_gone_one_keeps_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path / "cache"))
    tree = write_wmt_tree(tmp_path / "wmt")
    prepare_wmt(tmp_path, tree, [])
    (tree / "train.en").write_text((tree / "train.en").read_text().replace("house", "mouse"), encoding="utf-8")
    said = []
    data = prepare_wmt(tmp_path, None, said)  # train.py --corpus wmt14-en-de, the files given before
    assert "mouse" in data.vocab.decode(data.ids["train"].side_lists("src"))[0]
    assert sum(f"{tree.resolve() / 'train.en'} was modified" in line for line in said) == 1, said
    for p in tree.iterdir():
        p.unlink()
    said = []
    assert prepare_wmt(tmp_path, None, said).reused  # the build is all that is left of that text
    assert len(said) == 1 and f"{tree.resolve()}/" in said[0] and "is gone" in said[0], said
    assert said[0].endswith("the corpus built from it is kept"), said


def test_an_edited_saved_dataset_rebuilds_the_corpus(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    from numformer.data.wmt14 import build_wmt_corpus
    from support import save_wmt14_dataset

    def save(train):
        return save_wmt14_dataset(tmp_path / "saved", {"train": train, "validation": [("a b", "c d")],
                                                       "test": [("e f", "g h")]})
    saved = save([("the house", "das Haus"), ("a tree", "ein Baum")])
    age(p for p in saved.rglob("*") if p.is_file())
    folder = build_wmt_corpus("wmt14-en-de", saved, cache_dir=tmp_path / "cache")
    save([("the house", "das Haus"), ("a tree", "ein Baum"), ("the river", "der Fluss")])
    said = []
    assert build_wmt_corpus("wmt14-en-de", saved, cache_dir=tmp_path / "cache", log=said.append) == folder
    assert read_lines(folder / "train.tgt") == ["das Haus", "ein Baum", "der Fluss"]
    rebuilt = [line for line in said if "building it again" in line]
    assert len(rebuilt) == 1 and str(saved.resolve()) in rebuilt[0], said


def test_an_edited_data_dir_file_is_named_when_the_run_prepares_again(tmp_path):
    data_dir = tmp_path / "corpus"
    data_dir.mkdir()
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):
        (data_dir / f"{split}.src").write_text("".join(s + "\n" for s in sentences(WORDS, n)), encoding="utf-8")
        (data_dir / f"{split}.tgt").write_text("".join(s + "\n" for s in sentences(WOERTER, n)), encoding="utf-8")
    age(data_dir.iterdir())
    prepare(tmp_path / "run", data_dir=data_dir, vocab_size=60, seed=1)
    text = (data_dir / "valid.tgt").read_text(encoding="utf-8")
    (data_dir / "valid.tgt").write_text(text.replace("Haus", "Hans"), encoding="utf-8")
    said = []
    data = prepare(tmp_path / "run", data_dir=data_dir, vocab_size=60, seed=1, log=said.append)
    assert not data.reused and data.text["valid"][1][0].startswith("Hans")
    lines = [line for line in said if "preparing it again" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{data_dir.resolve() / 'valid.tgt'} was modified (same size"), said
    assert str(tmp_path / "run" / PREPARED) in lines[0]


def test_an_upgraded_sword_module_rebuilds_the_bible_corpus(tmp_path, monkeypatch):
    """The modules are stand-ins (a .conf and a data file each) and the reading of them is stubbed: what is
    tested is that the build records their files and notices one changed."""
    sword = tmp_path / "sword"
    for module in (bible.SRC_MODULE, bible.TGT_MODULE):
        data = sword / "modules" / "texts" / "ztext" / module.lower()
        data.mkdir(parents=True)
        (data / "nt.bzz").write_bytes(b"verses of " + module.encode())
        (sword / "mods.d").mkdir(exist_ok=True)
        (sword / "mods.d" / f"{module.lower()}.conf").write_text(
            f"[{module}]\nDataPath=./modules/texts/ztext/{module.lower()}/\nVersion=1.0\n", encoding="utf-8")
    age(p for p in sword.rglob("*") if p.is_file())
    builds = []

    def build_pairs(sword_path=None):
        builds.append(sword_path)
        pairs = {split: (["in the beginning"], ["en el principio"]) for split in ("train", "valid", "test")}
        return pairs, {"name": bible.CORPUS_NAME, "format_version": bible.FORMAT_VERSION,
                       "source": {"module": bible.SRC_MODULE, "version": "1.0"},
                       "target": {"module": bible.TGT_MODULE, "version": "1.0"}, "sword_path": str(sword)}
    monkeypatch.setattr(bible, "build_pairs", build_pairs)
    folder = bible.build_bible_corpus(tmp_path / "cache", sword_path=sword)
    assert bible.build_bible_corpus(folder, sword_path=sword) == folder and len(builds) == 1  # unchanged: reused
    target_data = sword / "modules" / "texts" / "ztext" / bible.TGT_MODULE.lower() / "nt.bzz"
    target_data.write_bytes(b"verses of the 2024 edition")
    said = []
    bible.build_bible_corpus(folder, sword_path=sword, log=said.append)
    assert len(builds) == 2
    assert said == [f"{bible.CORPUS_NAME}: {target_data.resolve()} changed size (21 -> 26 bytes) since {folder} "
                    "was built: building it again"]


def test_the_fingerprint_names_each_kind_of_change(tmp_path):
    from numformer.data.source_fingerprint import changes, fingerprint

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one")
    b.write_text("two")
    age([a, b])
    recorded = fingerprint([a, b], [{"name": "wmt/wmt14", "config": "de-en", "version": "1.0.0"}])
    assert changes(recorded) == []
    b.write_text("TWO")
    a.unlink()
    new = tmp_path / "c.txt"
    new.write_text("new")
    now = fingerprint([b, new], [{"name": "wmt/wmt14", "config": "de-en", "version": "2.0.0"}])
    found = {c.source: c.what for c in changes(recorded, now)}
    assert found.pop(str(a.resolve())) == "is gone"
    assert found.pop(str(new.resolve())) == "is new"
    assert found.pop("datasets wmt/wmt14 de-en") == "changed version (1.0.0 -> 2.0.0)"
    assert found.pop(str(b.resolve())).startswith("was modified (same size, modification time ")
    assert found == {}
    assert json.loads(json.dumps(recorded)) == recorded  # what the caches write into their JSON


def test_a_manifest_from_before_fingerprints_is_read_as_one_not_taken_for_a_change(tmp_path):
    """A run prepared by an older numformer recorded {"train.src": [size, mtime_ns], ...}: the same facts,
    so its corpus is reused, not encoded again (nor its vocabulary retrained) for want of paths."""
    data_dir = tmp_path / "corpus"
    data_dir.mkdir()
    for split, n in (("train", 40), ("valid", 5), ("test", 5)):
        (data_dir / f"{split}.src").write_text("".join(s + "\n" for s in sentences(WORDS, n)), encoding="utf-8")
        (data_dir / f"{split}.tgt").write_text("".join(s + "\n" for s in sentences(WOERTER, n)), encoding="utf-8")
    prepare(tmp_path / "run", data_dir=data_dir, vocab_size=60, seed=1)
    path = tmp_path / "run" / PREPARED / "manifest.json"
    manifest = json.loads(path.read_text())
    legacy = {name: [(data_dir / name).stat().st_size, (data_dir / name).stat().st_mtime_ns]
              for name in ("train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt")}
    manifest["files"] = legacy
    manifest["vocab"]["inputs"]["files"] = {k: v for k, v in legacy.items() if k.startswith("train.")}
    path.write_text(json.dumps(manifest))
    said = []
    assert prepare(tmp_path / "run", data_dir=data_dir, vocab_size=60, seed=1, log=said.append).reused and said == []
    with open(data_dir / "train.src", "a", encoding="utf-8") as f:
        f.write("house tree\n")
    with open(data_dir / "train.tgt", "a", encoding="utf-8") as f:
        f.write("Haus Baum\n")
    again = prepare(tmp_path / "run", data_dir=data_dir, vocab_size=60, seed=1, log=said.append)
    assert not again.reused and len(again.ids["train"]) == 41
    assert any(line.startswith(f"{data_dir.resolve() / 'train.'}") and "changed size" in line for line in said), said
