"""The bible-en-es corpus built from the SWORD modules.

Needs `apt-get install sword-text-web sword-text-sparv` and `pip install
pysword`; the build tests are skipped only when those are absent (CI installs
them). The corpus is built once per session into a temporary folder (~2 s).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.data import DataError, alignment, load_parallel_dir
from numformer.data import bible
from numformer.data.bible import osis
from numformer.data.bible.__main__ import main as bible_main

SWORD = Path("/usr/share/sword/mods.d")


def _installed():
    try:
        import pysword  # noqa: F401
    except ImportError:
        return False
    return (SWORD / "engWEB2015eb.conf").is_file() and (SWORD / "spaRV1909eb.conf").is_file()


needs_modules = pytest.mark.skipif(
    not _installed(),
    reason="needs `sudo apt-get install sword-text-web sword-text-sparv` and `pip install pysword`",
)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    if not _installed():
        pytest.skip("SWORD modules or pysword missing")
    return bible.build_bible_corpus(tmp_path_factory.mktemp("bible") / "bible-en-es")


@pytest.fixture(scope="session")
def corpus(corpus_dir):
    return load_parallel_dir(corpus_dir)


def lines_of(path):
    return path.read_text(encoding="utf-8").split("\n")[:-1]


@needs_modules
def test_split_sizes(corpus_dir, corpus):
    counts = {split: len(src) for split, (src, _) in corpus.items()}
    # 31,102 verses in the 66 books; about 2% are dropped.
    assert 27_500 <= counts["train"] <= 28_500
    assert 950 <= counts["valid"] <= 1_000      # 991 verses in the valid books
    assert 1_900 <= counts["test"] <= 1_975     # 1,970 verses in the test books
    meta = json.loads((corpus_dir / "meta.json").read_text(encoding="utf-8"))
    assert meta["counts"] == counts
    for split, (src, tgt) in corpus.items():
        assert len(src) == len(tgt)
        # The files are plain text, one pair per line, no line lost by the reader.
        assert len(lines_of(corpus_dir / f"{split}.src")) == counts[split]


@needs_modules
def test_held_out_books_are_not_in_train(corpus):
    train_src, train_tgt = corpus["train"]
    test_src, test_tgt = corpus["test"]
    valid_src, _ = corpus["valid"]
    ruth_1_16_en = "for where you go, I will go; and where you stay, I will stay"
    ruth_1_16_es = "porque donde quiera que tú fueres, iré yo"
    assert any(ruth_1_16_en in s for s in test_src)
    assert any(ruth_1_16_es in t for t in test_tgt)
    assert not any(ruth_1_16_en in s for s in train_src + valid_src)
    assert not any(ruth_1_16_es in t for t in train_tgt)
    # Acts 1:1 (test), Esther 1:1 (valid), Genesis 1:1 (train)
    assert any(s.startswith("The first book I wrote, Theophilus") for s in test_src)
    assert any("Ahasuerus" in s and "India" in s for s in valid_src)
    assert not any("Ahasuerus" in s and "India" in s for s in train_src + test_src)
    # Only formulaic verses repeated word for word in several books (e.g.
    # "Grace to you and peace from God our Father ...") occur in two splits.
    assert len(set(train_src) & set(test_src)) <= 5
    assert len(set(train_src) & set(valid_src)) <= 5


@needs_modules
def test_known_pairs_are_aligned(corpus):
    pairs = dict(zip(*corpus["train"]))
    assert pairs["In the beginning, God created the heavens and the earth."] == \
        "EN el principio crió Dios los cielos y la tierra."
    # A footnote sat between "only born" and "Son": it must leave one space.
    john = [s for s in pairs if s.startswith("For God so loved the world")]
    assert john == ["For God so loved the world, that he gave his only born Son, that whoever believes in him "
                    "should not perish, but have eternal life."]
    assert pairs[john[0]].startswith("Porque de tal manera amó Dios al mundo")
    # Psalm superscriptions are kept on both sides (part of verse 1).
    ps3 = [s for s in pairs if s.startswith("A Psalm by David, when he fled from Absalom his son.")]
    assert len(ps3) == 1 and pairs[ps3[0]].startswith("Salmo de David, cuando huía de delante de Absalom")
    # Numbers 13: the Spanish module numbers it one verse later (12:16 is its
    # 13:1); the re-alignment pairs the verses by content.
    num = [s for s in pairs if s.startswith("“Send men, that they may spy out the land of Canaan")]
    assert len(num) == 1 and pairs[num[0]].startswith("Envía tú hombres que reconozcan la tierra de Canaán")
    hazeroth = [s for s in pairs if s.startswith("Afterward the people traveled from Hazeroth")]
    assert len(hazeroth) == 1 and pairs[hazeroth[0]].startswith("Y DESPUÉS movió el pueblo de Haseroth")


@needs_modules
def test_jonah_shift_is_realigned_in_test(corpus):
    pairs = dict(zip(*corpus["test"]))
    fish = [s for s in pairs if s.startswith("Yahweh prepared a huge fish to swallow up Jonah")]
    assert len(fish) == 1 and pairs[fish[0]].startswith("MAS Jehová había prevenido un gran pez")
    prayed = [s for s in pairs if s.startswith("Then Jonah prayed to Yahweh, his God")]
    assert len(prayed) == 1 and pairs[prayed[0]].startswith("Y oró Jonás desde el vientre del pez")


@needs_modules
def test_text_is_clean(corpus):
    for split, (src, tgt) in corpus.items():
        for line in src + tgt:
            assert line and line == " ".join(line.split())
            assert "<" not in line and ">" not in line and "strong:" not in line and "\x00" not in line
    everything = "\n".join(s for src, tgt in corpus.values() for s in src + tgt)
    # Notes, headings and the glossary after Revelation are gone.
    assert "Abaddon is Hebrew for destruction" not in everything
    assert "The Hebrew word rendered “God”" not in everything
    # Words the Spanish translators added (<transChange>) keep their spaces.
    assert "Rehum y Baana" in everything and "RehumyBaana" not in everything


@needs_modules
def test_length_rule_holds(corpus_dir, corpus):
    meta = json.loads((corpus_dir / "meta.json").read_text(encoding="utf-8"))
    model = meta["length_model"]
    assert 0.9 < model["ratio"] < 1.0 and 1.0 < model["scale"] < 1.7
    src, tgt = corpus["train"]
    d = alignment.length_deviation([len(s) for s in src], [len(t) for t in tgt], model["ratio"], model["scale"])
    assert np.abs(d).max() <= bible.MAX_DEVIATION
    assert meta["stats"]["dropped_length"] < 200


@needs_modules
def test_cache_is_reused_and_force_rebuilds(corpus_dir, tmp_path):
    stamp = (corpus_dir / "train.src").stat().st_mtime_ns
    assert bible.build_bible_corpus(corpus_dir) == corpus_dir
    assert (corpus_dir / "train.src").stat().st_mtime_ns == stamp
    # A cache of another format version is rebuilt.
    other = tmp_path / "c"
    bible.build_bible_corpus(other)
    meta = json.loads((other / "meta.json").read_text(encoding="utf-8"))
    meta["format_version"] = -1
    (other / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    (other / "train.src").write_text("stale\n", encoding="utf-8")
    bible.build_bible_corpus(other)
    assert (other / "train.src").read_bytes() == (corpus_dir / "train.src").read_bytes()
    (other / "train.src").write_text("stale\n", encoding="utf-8")
    bible.build_bible_corpus(other, force=True)
    assert (other / "train.src").read_bytes() == (corpus_dir / "train.src").read_bytes()


@needs_modules
def test_cli_prints_counts(corpus_dir, corpus, capsys):
    assert bible_main(["--out", str(corpus_dir)]) == 0
    out = capsys.readouterr().out
    assert str(corpus_dir) in out
    for split in ("train", "valid", "test"):
        assert f"{split:5s} {len(corpus[split][0]):6d} pairs" in out
    assert "found in the cache" in out


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path))
    assert bible.default_cache_dir() == tmp_path / "bible-en-es"
    monkeypatch.delenv("NUMFORMER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert bible.default_cache_dir() == tmp_path / "x" / "numformer" / "bible-en-es"


def test_sword_path_is_searched_first(monkeypatch, tmp_path):
    from numformer.data.bible import sword

    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    assert sword.candidate_sword_paths()[0] == tmp_path
    assert sword.candidate_sword_paths(tmp_path / "given") == [tmp_path / "given"]


def test_the_command_runs_as_a_module_without_warnings():
    import subprocess

    proc = subprocess.run([sys.executable, "-W", "error", "-m", "numformer.data.bible", "--help"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0 and "--sword-path" in proc.stdout, proc.stderr


def test_missing_modules_give_the_install_command(tmp_path):
    pytest.importorskip("pysword")
    (tmp_path / "mods.d").mkdir()
    with pytest.raises(DataError) as e:
        bible.build_bible_corpus(tmp_path / "out", sword_path=tmp_path)
    msg = str(e.value)
    assert "sudo apt-get install sword-text-web sword-text-sparv" in msg
    assert "engWEB2015eb" in msg and "spaRV1909eb" in msg and str(tmp_path) in msg
    assert "\n" not in msg
    assert not (tmp_path / "out" / "meta.json").exists()


@needs_modules
def test_broken_module_data_gives_the_reinstall_command(tmp_path):
    # Conf files present, data files gone (a half-removed install).
    (tmp_path / "mods.d").mkdir()
    for name in ("engWEB2015eb.conf", "spaRV1909eb.conf"):
        (tmp_path / "mods.d" / name).write_bytes((SWORD / name).read_bytes())
    with pytest.raises(DataError, match=r"could not be opened.*apt-get install --reinstall sword-text-web"):
        bible.build_bible_corpus(tmp_path / "out", sword_path=tmp_path)


def test_missing_pysword_gives_the_install_command(tmp_path, monkeypatch):
    # A None entry in sys.modules makes `import pysword.modules` fail.
    monkeypatch.setitem(sys.modules, "pysword", None)
    monkeypatch.setitem(sys.modules, "pysword.modules", None)
    with pytest.raises(DataError, match=r"pip install pysword"):
        bible.build_bible_corpus(tmp_path / "out")
    assert bible_main(["--out", str(tmp_path / "out")]) == 2  # a DataError: the user's to fix


def test_clean_osis():
    raw = ('<w lemma="strong:H0430">In</w> <w lemma="strong:H0853">the</w> <w>beginning</w>, <w>God</w>'
           '<note placement="foot"><reference type="annotateRef">1:1 </reference>A note.</note>'
           '<w>created</w> &amp; <w>made</w><note>x</note>. ')
    assert osis.clean_osis(raw) == "In the beginning, God created & made."
    psalm = ('<div type="x-milestone" subType="x-preverse" sID="pv1"/><title canonical="true" type="psalm">'
             'A Psalm by David.</title> <lg sID="g1"/> <l level="1" sID="g2"/>Yahweh, how<l eID="g2" level="1"/>'
             '<l level="2" sID="g3"/>many!<l eID="g3" level="2"/>')
    assert osis.clean_osis(psalm) == "A Psalm by David. Yahweh, how many!"
    heading = '<title type="section">A heading</title><speaker>Beloved</speaker> Let him kiss me'
    assert osis.clean_osis(heading) == "Let him kiss me"
    tail = 'Amen. <chapter eID="Rev.22"/> <div eID="x" osisID="Rev" type="book"/> <title>Glossary</title> words'
    assert osis.clean_osis(tail) == "Amen."
    added = ('<w>Rehum</w><transChange type="added">y</transChange><w>Baana</w>. '
             '(<transChange type="added">dijo</transChange>) ¿<w>Quién</w>?')
    assert osis.clean_osis(added) == "Rehum y Baana. (dijo) ¿Quién?"
