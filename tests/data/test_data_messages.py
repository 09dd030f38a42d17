"""The messages-en-es corpus, built from gettext catalogs (.mo files) that each test writes itself: nothing here
depends on what /usr/share/locale holds. Reading (the .mo format, contexts, plurals, charsets), the cleaning
rules one by one, the hash split, the cache (reused; rebuilt when a catalog changes or appears) and the
one-line errors."""
from __future__ import annotations

import gettext
import json
import struct
from pathlib import Path

import pytest

from numformer.data import DataError, load_parallel_dir
from numformer.data import messages
from numformer.data.messages import catalogs as catalogs_module
from numformer.data.messages.__main__ import main as messages_main
from numformer.data.messages.catalogs import find_catalogs
from numformer.data.messages.cleaning import MAX_WORDS, clean_message, drop_reason, strip_mnemonic, uses_mnemonics
from numformer.data.messages.mo_file import MoFileError, read_mo
from numformer.data.sources import CORPORA, resolve_source

MAGIC = 0x950412DE


def write_mo(path: Path, entries, charset: str = "UTF-8", order: str = "<") -> Path:
    """A .mo file holding the header (empty msgid, naming ``charset``) and ``entries`` ``[(msgid, msgstr)]``;
    a msgid ``"ctx\\x04id"`` has a context, ``"one\\x00many"`` is plural (its msgstr ``"uno\\x00muchos"``).
    Layout: magic, revision 0, N, offset of the originals' table, of the translations' table, hash size 0,
    hash offset; then the two tables of (length, offset); then the NUL-terminated strings."""
    items = sorted([("", f"Content-Type: text/plain; charset={charset}\nLanguage: es\n"), *entries],
                   key=lambda kv: kv[0].encode(charset))
    keys = [k.encode(charset) for k, _ in items]
    values = [v.encode(charset) for _, v in items]
    n = len(items)
    originals, translations = 28, 28 + 8 * n
    offset = translations + 8 * n
    table_o, table_t, blob = b"", b"", b""
    for table, strings in (("o", keys), ("t", values)):
        for s in strings:
            entry = struct.pack(order + "2I", len(s), offset + len(blob))
            blob += s + b"\0"
            if table == "o":
                table_o += entry
            else:
                table_t += entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack(order + "7I", MAGIC, 0, n, originals, translations, 0, offset)
                     + table_o + table_t + blob)
    return path


def sentences(n: int, start: int = 0, word: str = "file") -> list[tuple[str, str]]:
    """``n`` ordinary messages and their translations (distinct English, about 1.2 times longer in Spanish)."""
    spanish = {"file": "fichero", "link": "enlace", "queue": "cola"}[word]
    return [(f"cannot open the {word} number {i} for reading",
             f"no se puede abrir el {spanish} número {i} para lectura") for i in range(start, start + n)]


def catalog(locale_dir: Path, name: str, entries, locale: str = "es", **kwargs) -> Path:
    return write_mo(locale_dir / locale / "LC_MESSAGES" / f"{name}.mo", entries, **kwargs)


def corpus_pairs(folder: Path) -> dict[str, str]:
    """English -> Spanish over the three splits of a built corpus."""
    out = {}
    for src, tgt in load_parallel_dir(folder).values():
        out.update(zip(src, tgt))
    return out


def split_by_english(folder: Path) -> dict[str, str]:
    return {english: split for split, (src, _) in load_parallel_dir(folder).items() for english in src}


# -- the .mo file --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["<", ">"])
def test_the_fixture_catalogs_are_what_gettext_reads(tmp_path, order):
    path = write_mo(tmp_path / "x.mo", [("Open", "Abrir"), ("menu\x04_Quit", "_Salir"),
                                        ("%d file\x00%d files", "%d fichero\x00%d ficheros")], order=order)
    with open(path, "rb") as f:
        stdlib = gettext.GNUTranslations(f)
    assert stdlib.gettext("Open") == "Abrir"
    assert stdlib.pgettext("menu", "_Quit") == "_Salir"
    assert stdlib.ngettext("%d file", "%d files", 2) == "%d ficheros"


@pytest.mark.parametrize("order", ["<", ">"])
def test_read_mo_gives_each_entry_whole(tmp_path, order):
    path = write_mo(tmp_path / "x.mo", [("Open", "Abrir"), ("menu\x04_Quit", "_Salir"),
                                        ("%d file\x00%d files", "%d fichero\x00%d ficheros")], order=order)
    entries = {e.msgid: e for e in read_mo(path)}
    assert set(entries) == {"", "Open", "_Quit", "%d file"}
    assert entries[""].msgstr.startswith("Content-Type")
    assert (entries["Open"].msgstr, entries["Open"].context, entries["Open"].plural) == ("Abrir", None, False)
    assert (entries["_Quit"].msgstr, entries["_Quit"].context) == ("_Salir", "menu")
    assert (entries["%d file"].msgstr, entries["%d file"].plural) == ("%d fichero", True)


def test_read_mo_decodes_the_charset_the_header_names(tmp_path):
    path = write_mo(tmp_path / "x.mo", [("Settings", "Configuración")], charset="ISO-8859-1")
    assert b"Configuraci\xf3n" in path.read_bytes()
    assert [e.msgstr for e in read_mo(path) if e.msgid == "Settings"] == ["Configuración"]


def test_read_mo_names_a_file_that_is_not_a_catalog(tmp_path):
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"this is not a catalog at all, just text")
    with pytest.raises(MoFileError, match="bad.mo is not a gettext catalog"):
        read_mo(bad)
    good = write_mo(tmp_path / "cut.mo", sentences(3))
    cut = tmp_path / "cut2.mo"
    cut.write_bytes(good.read_bytes()[:60])
    with pytest.raises(MoFileError, match="truncated"):
        read_mo(cut)


# -- cleaning --------------------------------------------------------------------------------------------------------

def test_one_line_per_message():
    assert clean_message("Usage: %s [OPTION]...\n\t-a, --all\tshow all\n\n") == \
        "Usage: %s [OPTION]... -a, --all show all"
    assert clean_message("  two   spaces  ") == "two spaces"
    assert clean_message("\atimed out waiting for input") == "timed out waiting for input"   # bash's bell


def test_placeholders_are_kept():
    assert clean_message("%s: cannot open %1$s: {0} %d%%") == "%s: cannot open %1$s: {0} %d%%"


def test_mnemonics_are_removed_only_where_the_catalog_uses_them():
    assert clean_message("_Open", mnemonics=True) == "Open"
    assert clean_message("Or_den de páginas:", mnemonics=True) == "Orden de páginas:"
    assert clean_message("Save _As", mnemonics=True) == "Save As"
    assert clean_message("_Open", mnemonics=False) == "_Open"
    assert clean_message("with_query", mnemonics=False) == "with_query"


def test_what_strip_mnemonic_leaves_alone():
    assert strip_mnemonic("KP_Begin") == "KP_Begin"          # a key's name: a letter joined to a capital
    assert strip_mnemonic("text_view_markup") == "text_view_markup"   # more than one underscore
    assert strip_mnemonic("_%d. %s") == "_%d. %s"            # no letter after it
    assert strip_mnemonic("C_reate") == "Create"


def test_which_catalogs_use_mnemonics():
    labels = ["_Open", "_Save", "Cancel", "Print", "Quit", "Help", "About", "Copy", "Paste", "Undo"]
    assert uses_mnemonics(labels)                            # 2 of 10 start with "_" and a capital
    assert not uses_mnemonics(["sh_link not set", "_start undefined"] + ["x"] * 30)
    assert not uses_mnemonics([])


def test_drop_reasons():
    assert drop_reason("%s: %s", "%s: %s %s") == "no_letters"
    assert drop_reason("OK", "OK") == "identical"
    long = " ".join(["word"] * (MAX_WORDS + 1))
    assert drop_reason(long, "palabra") == "too_long"
    assert drop_reason("word", long) == "too_long"
    assert drop_reason(" ".join(["word"] * MAX_WORDS), "palabras") is None
    assert drop_reason("Open", "Abrir") is None


# -- the build ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def locale_dir(tmp_path):
    """A locale folder: coreutils and gtk20 in es, tar in es_MX, a name list, a French catalog."""
    root = tmp_path / "locale"
    long = " ".join(["word"] * (MAX_WORDS + 1))
    catalog(root, "coreutils", sentences(40) + [
        ("memory exhausted", "memoria agotada"),
        ("Try '%s --help'\nfor more\tinformation.\n", "Pruebe '%s --help'\npara más información.\n"),
        ("%s: %s", "%s: %s"),                                  # no letter
        ("OK", "OK"),                                          # the same
        ("Hello\n", "Hello"),                                  # the same after cleaning
        ("empty", ""),                                         # untranslated
        (long, "palabras"),                                    # too long
        ("No", "No se ha encontrado ninguna coincidencia en ninguno de los ficheros que se han dado para buscar"),
        ("%d byte\x00%d bytes", "%d byte\x00%d bytes"),        # plural
    ])
    catalog(root, "gtk20", [("_Open", "_Abrir"), ("stock\x04_Quit", "_Salir"), ("C_reate", "C_rear"),
                            ("Page _Setup", "Configurar _página"), ("KP_Begin", "TN Inicio"),
                            ("memory exhausted", "memoria agotada (gtk)")] + sentences(4, word="link"))
    catalog(root, "tar", [("memory exhausted", "se agotó la memoria"),
                          ("Archive is compressed", "El archivo está comprimido")], locale="es_MX")
    catalog(root, "iso_3166-1", [("Spain", "España"), ("Germany", "Alemania")])
    catalog(root, "xkeyboard-config", [("English (US)", "Inglés (EE. UU.)")])
    catalog(root, "coreutils", [("Open", "Ouvrir")], locale="fr")
    return root


@pytest.fixture
def built(tmp_path, locale_dir):
    return messages.build_messages_corpus(tmp_path / "corpus", locale_dir=locale_dir)


def test_the_pairs_read(built):
    pairs = corpus_pairs(built)
    assert pairs["cannot open the file number 7 for reading"] == "no se puede abrir el fichero número 7 para lectura"
    assert pairs["Try '%s --help' for more information."] == "Pruebe '%s --help' para más información."
    assert pairs["Archive is compressed"] == "El archivo está comprimido"      # es_MX is Spanish too
    assert pairs["Quit"] == "Salir"                                            # a context: the message kept
    assert pairs["Open"] == "Abrir"                                            # French is not read
    assert "Spain" not in pairs and "English (US)" not in pairs                # name lists set aside
    assert len(pairs) == 40 + 2 + 4 + 4 + 1 + 1    # coreutils, gtk20 (_Open, Quit, Create, Page Setup, 4 links), tar
    for folder_file in ("train.src", "valid.src", "test.src"):                 # English is the source side
        assert "para" not in (built / folder_file).read_text(encoding="utf-8")


def test_each_cleaning_rule_in_the_build(built):
    pairs = corpus_pairs(built)
    meta = messages.load_meta(built)
    stats = meta["stats"]
    assert (stats["no_letters"], stats["identical"], stats["untranslated"], stats["too_long"], stats["plural"]) == \
        (1, 2, 1, 1, 1)
    assert stats["length_ratio"] == 1 and "No" not in pairs                    # 1 word -> 16: dropped by length
    assert pairs["Create"] == "Crear" and pairs["Page Setup"] == "Configurar página"   # gtk20 uses mnemonics
    assert "KP_Begin" in pairs
    assert meta["catalogs"]["es/gtk20"]["mnemonics"] and not meta["catalogs"]["es/coreutils"]["mnemonics"]
    assert set(meta["set_aside"]) == {"es/iso_3166-1", "es/xkeyboard-config"}
    assert meta["set_aside"]["es/iso_3166-1"]["entries"] == 2
    assert sum(meta["counts"].values()) == stats["kept"] == len(pairs)


def test_duplicates_keep_the_first_catalog_by_name(built):
    # "memory exhausted" is in coreutils (es), gtk20 (es) and tar (es_MX): coreutils comes first by name.
    assert corpus_pairs(built)["memory exhausted"] == "memoria agotada"
    assert messages.load_meta(built)["stats"]["duplicate"] == 2


def test_the_split_is_a_hash_of_the_english_text():
    # Golden values: sha256, not Python's hash() (salted per process), so they hold in any process.
    golden = {"message 50": "valid", "message 150": "valid", "message 4": "test", "message 67": "test",
              "message 0": "train", "message 1": "train"}
    assert {english: messages.split_of(english) for english in golden} == golden
    splits = [messages.split_of(f"cannot open the file number {i} for reading") for i in range(4000)]
    for split in ("valid", "test"):
        assert abs(splits.count(split) / 4000 - messages.VALID_PER_MILLE / 1000) < 0.01


def test_a_message_keeps_its_split_whatever_else_is_installed(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "coreutils", sentences(300))
    alone = split_by_english(messages.build_messages_corpus(tmp_path / "alone", locale_dir=root))
    # A catalog read before coreutils (by name), with many messages: positions shift, splits must not.
    catalog(root, "aaa-extra", sentences(500, start=1000, word="queue"))
    more = split_by_english(messages.build_messages_corpus(tmp_path / "more", locale_dir=root))
    assert len(more) == 800
    assert {e: more[e] for e in alone} == alone
    assert {"valid", "test", "train"} <= set(alone.values())


def test_the_split_is_deterministic(tmp_path, locale_dir):
    a = messages.build_messages_corpus(tmp_path / "a", locale_dir=locale_dir)
    b = messages.build_messages_corpus(tmp_path / "b", locale_dir=locale_dir)
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


# -- the cache -------------------------------------------------------------------------------------------------------

def test_the_cache_is_reused(tmp_path, locale_dir, built, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(messages, "build_pairs", no_build)
    assert messages.build_messages_corpus(built, locale_dir=locale_dir) == built
    assert messages.cache_is_complete(built)


def test_a_changed_catalog_rebuilds_the_cache(locale_dir, built):
    lines = []
    catalog(locale_dir, "tar", [("Archive is compressed", "El archivo está comprimido con gzip")], locale="es_MX")
    messages.build_messages_corpus(built, locale_dir=locale_dir, log=lines.append)
    assert len(lines) == 1 and "tar.mo changed size" in lines[0] and "building it again" in lines[0]
    assert corpus_pairs(built)["Archive is compressed"] == "El archivo está comprimido con gzip"


def test_a_new_catalog_rebuilds_and_a_gone_one_keeps_the_cache(locale_dir, built):
    lines = []
    catalog(locale_dir, "sed", [("no input files", "no hay ficheros de entrada")])
    messages.build_messages_corpus(built, locale_dir=locale_dir, log=lines.append)
    assert len(lines) == 1 and "sed.mo is new" in lines[0]
    assert "no input files" in corpus_pairs(built)
    (locale_dir / "es" / "LC_MESSAGES" / "sed.mo").unlink()
    messages.build_messages_corpus(built, locale_dir=locale_dir, log=lines.append)
    assert len(lines) == 1 and "no input files" in corpus_pairs(built)


def test_a_changed_name_list_does_not_rebuild(locale_dir, built):
    lines = []
    catalog(locale_dir, "iso_3166-1", [("Spain", "España"), ("France", "Francia"), ("Italy", "Italia")])
    messages.build_messages_corpus(built, locale_dir=locale_dir, log=lines.append)
    assert lines == []


def test_an_unfinished_or_older_build_is_built_again(locale_dir, built):
    # what an interrupted build leaves: its files and a meta.json that says it is building
    (built / "meta.json").write_text(json.dumps({"name": "messages-en-es", "format_version": messages.FORMAT_VERSION,
                                                 "building": True}), encoding="utf-8")
    assert not messages.cache_is_complete(built)
    messages.build_messages_corpus(built, locale_dir=locale_dir)
    meta = messages.load_meta(built)
    assert messages.cache_is_complete(built)
    meta["format_version"] = messages.FORMAT_VERSION - 1
    (built / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    assert not messages.cache_is_complete(built)


def test_meta_records_the_catalogs_read(built, locale_dir):
    meta = messages.load_meta(built)
    recorded = {Path(f["path"]).name for f in meta["sources"]["files"]}
    assert recorded == {"coreutils.mo", "gtk20.mo", "tar.mo"}
    assert meta["name"] == "messages-en-es" and meta["format_version"] == messages.FORMAT_VERSION
    assert meta["locale_dirs"] == [str(locale_dir)]


def test_a_damaged_catalog_is_skipped_and_named(tmp_path, locale_dir):
    (locale_dir / "es" / "LC_MESSAGES" / "broken.mo").write_bytes(b"\0" * 40)
    lines = []
    folder = messages.build_messages_corpus(tmp_path / "c", locale_dir=locale_dir, log=lines.append)
    assert len(lines) == 1 and "broken.mo is not a gettext catalog" in lines[0]
    assert [s["catalog"] for s in messages.load_meta(folder)["skipped"]] == ["es/broken"]
    assert "memory exhausted" in corpus_pairs(folder)


# -- errors ------------------------------------------------------------------------------------------------------------

def one_line_error(call) -> str:
    with pytest.raises(DataError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_no_spanish_catalogs_is_one_line_saying_what_to_do(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "coreutils", [("Open", "Ouvrir")], locale="fr")
    message = one_line_error(lambda: messages.build_messages_corpus(tmp_path / "c", locale_dir=root))
    assert "no Spanish message catalogs" in message and str(root) in message
    assert "apt-get install" in message and "--data DIR" in message
    assert not (tmp_path / "c").exists()


def test_only_name_lists_is_one_line_too(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "iso_639-3", [("German", "Alemán")])
    message = one_line_error(lambda: messages.build_messages_corpus(tmp_path / "c", locale_dir=root))
    assert "only lists of names" in message and "--data DIR" in message


def test_a_missing_locale_folder_is_one_line(tmp_path):
    message = one_line_error(lambda: messages.build_messages_corpus(tmp_path / "c", locale_dir=tmp_path / "nowhere"))
    assert "nowhere does not exist" in message and "es/LC_MESSAGES" in message


def test_nothing_usable_is_one_line(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "coreutils", [("OK", "OK"), ("%s", "%s")])
    message = one_line_error(lambda: messages.build_messages_corpus(tmp_path / "c", locale_dir=root))
    assert "no usable translation" in message


# -- another language: English -> German from the German catalogs, a folder for --data --------------------------

def german(n: int, start: int = 0) -> list[tuple[str, str]]:
    return [(f"cannot open the file number {i} for reading", f"die Datei Nummer {i} kann nicht gelesen werden")
            for i in range(start, start + n)]


@pytest.fixture
def german_locale_dir(locale_dir):
    """The Spanish fixture catalogs (and a French one) plus German ones under ``de`` and ``de_AT``, and a
    ``dev`` folder that is not German."""
    catalog(locale_dir, "coreutils", german(30), locale="de")
    catalog(locale_dir, "tar", [("Archive is compressed", "Das Archiv ist komprimiert")], locale="de_AT")
    catalog(locale_dir, "bash", [("Archive is broken", "Archiv kaputt")], locale="dev")
    return locale_dir


def test_another_language_reads_only_its_catalogs(tmp_path, german_locale_dir):
    folder = messages.build_messages_corpus(tmp_path / "de", locale_dir=german_locale_dir, language="de")
    pairs = corpus_pairs(folder)
    assert pairs["cannot open the file number 7 for reading"] == "die Datei Nummer 7 kann nicht gelesen werden"
    assert pairs["Archive is compressed"] == "Das Archiv ist komprimiert"  # de_AT is German too
    assert len(pairs) == 31  # no Spanish, French or 'dev' message
    meta = messages.load_meta(folder)
    assert (meta["name"], meta["target"]["lang"]) == ("messages-en-de", "de")
    assert messages.cache_is_complete(folder, "de") and not messages.cache_is_complete(folder)


def test_the_spanish_build_is_unchanged_by_other_languages(tmp_path, german_locale_dir, locale_dir):
    assert corpus_pairs(messages.build_messages_corpus(tmp_path / "es", locale_dir=german_locale_dir)) == \
        corpus_pairs(messages.build_messages_corpus(tmp_path / "only-es", locale_dir=locale_dir))


def test_the_command_builds_another_language_into_a_data_folder(tmp_path, german_locale_dir, capsys):
    out = tmp_path / "messages-en-de"
    assert messages_main(["--language", "de", "--locale-dir", str(german_locale_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"messages-en-de (English -> German) in {out}")
    assert resolve_source(None, str(out), None) == (out, f"data:{out.resolve()}")  # train.py --data takes it


def test_another_languages_default_cache_is_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path))
    assert (messages.default_cache_dir(), messages.default_cache_dir("de")) == (tmp_path / "messages-en-es",
                                                                               tmp_path / "messages-en-de")


@pytest.mark.parametrize("code", ["German", "DE", "de_DE", "d", "../es"])
def test_a_language_that_is_not_a_code_is_a_one_line_usage_error(code, capsys):
    assert messages_main(["--language", code]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a language code" in err


def test_no_catalogs_of_the_language_is_one_line_naming_it(tmp_path, locale_dir):
    message = one_line_error(lambda: messages.build_messages_corpus(tmp_path / "c", locale_dir=locale_dir,
                                                                    language="it"))
    assert "no Italian message catalogs (it*/LC_MESSAGES/*.mo)" in message and "language-pack-it-base" in message
    assert not (tmp_path / "c").exists()


# -- where the corpus is named -------------------------------------------------------------------------------------

def test_find_catalogs_order_and_links(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "tar", sentences(1), locale="es_MX")
    catalog(root, "bash", sentences(1))
    catalog(root, "tar", sentences(1))
    (root / "es_ES" / "LC_MESSAGES").mkdir(parents=True)
    (root / "es_ES" / "LC_MESSAGES" / "bash.mo").symlink_to(root / "es" / "LC_MESSAGES" / "bash.mo")
    found = find_catalogs([root])
    assert [str(c) for c in found] == ["es/bash", "es/tar", "es_MX/tar"]


def test_the_corpus_is_named_like_the_bible(tmp_path, locale_dir, monkeypatch, capsys):
    assert "messages-en-es" in CORPORA
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(catalogs_module, "DEFAULT_LOCALE_DIRS", (locale_dir,))
    folder, source = resolve_source("messages-en-es", None, None)
    assert (folder, source) == (tmp_path / "cache" / "messages-en-es", "corpus:messages-en-es")
    assert messages.cache_is_complete(folder)
    assert messages_main([]) == 0
    out = capsys.readouterr().out
    counts = messages.load_meta(folder)["counts"]
    assert f"train {counts['train']:6d} pairs" in out and "found in the cache" in out
