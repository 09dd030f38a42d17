"""A corpus build writes only into a new or empty folder or one holding a build of the same corpus
(numformer/data/built_corpus.py's refuse_foreign_folder): a user's own corpus folder, or another corpus's build,
given as the --out of a builder is refused in one line and left as it was."""
from __future__ import annotations

import json

import pytest

from numformer.data import DataError, messages
from numformer.data.bible import build_bible_corpus
from numformer.data.messages.__main__ import main as messages_main
from numformer.data.text_files import CORPUS_FILES

from test_data_messages import catalog, sentences  # the fixture catalogs this folder's tests write


@pytest.fixture
def locale_dir(tmp_path):
    root = tmp_path / "locale"
    catalog(root, "coreutils", sentences(30))
    catalog(root, "coreutils", [(f"cannot open the file number {i} for reading", f"die Datei {i} geht nicht auf")
                                for i in range(30)], locale="de")
    return root


def contents(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def users_corpus(folder):
    folder.mkdir(parents=True)
    for name in CORPUS_FILES:
        (folder / name).write_text(f"my own {name}\n", encoding="utf-8")
    return folder


def test_a_users_corpus_folder_is_refused_and_kept(tmp_path, locale_dir):
    mine = users_corpus(tmp_path / "mine")
    before = contents(mine)
    with pytest.raises(DataError, match="corpus files no build wrote .*give a new or empty folder") as info:
        messages.build_messages_corpus(mine, locale_dir=locale_dir, force=True)
    assert "\n" not in str(info.value)
    assert contents(mine) == before


def test_another_corpus_build_is_refused_and_kept(tmp_path, locale_dir):
    spanish = messages.build_messages_corpus(tmp_path / "es", locale_dir=locale_dir)
    before = contents(spanish)
    with pytest.raises(DataError, match="holds a build of messages-en-es: building messages-en-de there"):
        messages.build_messages_corpus(spanish, locale_dir=locale_dir, language="de")
    with pytest.raises(DataError, match="holds a build of messages-en-es: building bible-en-es there"):
        build_bible_corpus(spanish)  # refused before the Bible modules are looked for
    assert contents(spanish) == before


def test_the_command_refuses_in_one_line_with_exit_2(tmp_path, locale_dir, capsys):
    mine = users_corpus(tmp_path / "mine")
    before = contents(mine)
    assert messages_main(["--locale-dir", str(locale_dir), "--out", str(mine)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert contents(mine) == before


def test_a_folder_of_other_files_gets_the_corpus_beside_them(tmp_path, locale_dir):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me\n", encoding="utf-8")
    messages.build_messages_corpus(folder, locale_dir=locale_dir)
    assert messages.cache_is_complete(folder) and (folder / "notes.txt").read_text(encoding="utf-8") == "keep me\n"


def test_an_interrupted_build_says_so_and_is_built_again(tmp_path, locale_dir, monkeypatch):
    folder = tmp_path / "c"

    def written_then_interrupted(folder, splits):
        for name in CORPUS_FILES[:3]:
            (folder / name).write_text("half\n", encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr("numformer.data.built_corpus.write_parallel_dir", written_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        messages.build_messages_corpus(folder, locale_dir=locale_dir)
    assert json.loads((folder / "meta.json").read_text(encoding="utf-8"))["building"] is True
    assert not messages.cache_is_complete(folder)
    monkeypatch.undo()
    messages.build_messages_corpus(folder, locale_dir=locale_dir)
    assert messages.cache_is_complete(folder)
