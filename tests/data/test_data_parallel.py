"""Reading corpus folders: normalisation, line counting and error messages."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numformer.data import (CORPUS_FILES, DataError, load_parallel_dir, normalize_line, read_lines,
                            write_parallel_dir)


def write_corpus(folder, files):
    """files: name -> bytes or str; missing names get two default lines."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_FILES:
        data = files.get(name, "one\ntwo\n")
        if isinstance(data, str):
            data = data.encode("utf-8")
        (folder / name).write_bytes(data)
    return folder


def test_loads_all_splits_and_normalises(tmp_path):
    folder = write_corpus(tmp_path / "c", {
        # BOM, CRLF, tabs, runs of spaces, leading/trailing blanks, no final newline.
        "train.src": "\ufeffHello   world\r\n\t  two\ttabs here \r\nlast",
        "train.tgt": "Hola mundo\ndos\u00a0 espacios\nfinal\n",
        "test.src": "a\n\nb\n",      # an empty line in the middle is kept
        "test.tgt": "x\n\ny\n",
    })
    data = load_parallel_dir(folder)
    assert list(data) == ["train", "valid", "test"]
    assert data["train"] == (["Hello world", "two tabs here", "last"], ["Hola mundo", "dos espacios", "final"])
    assert data["valid"] == (["one", "two"], ["one", "two"])
    assert data["test"] == (["a", "", "b"], ["x", "", "y"])


def test_accepts_str_path(tmp_path):
    folder = write_corpus(tmp_path / "c", {})
    assert load_parallel_dir(str(folder))["train"][0] == ["one", "two"]


def test_missing_folder_names_it_and_the_files(tmp_path):
    with pytest.raises(DataError) as e:
        load_parallel_dir(tmp_path / "nope")
    msg = str(e.value)
    assert "nope" in msg and "does not exist" in msg
    for name in CORPUS_FILES:
        assert name in msg
    assert "\n" not in msg


def test_path_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataError, match="is a text file, not a corpus folder"):
        load_parallel_dir(tmp_path / "f")


def test_missing_files_are_named(tmp_path):
    folder = write_corpus(tmp_path / "c", {})
    (folder / "valid.tgt").unlink()
    (folder / "test.src").unlink()
    with pytest.raises(DataError) as e:
        load_parallel_dir(folder)
    msg = str(e.value)
    assert "valid.tgt" in msg and "test.src" in msg and "lacks" in msg
    assert "train.src train.tgt valid.src valid.tgt test.src test.tgt" in msg
    assert "\n" not in msg


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    folder = write_corpus(tmp_path / "c", {"valid.src": "a\nb\nc\n", "valid.tgt": "a\nb\n"})
    with pytest.raises(DataError) as e:
        load_parallel_dir(folder)
    msg = str(e.value)
    assert "valid.src" in msg and "valid.tgt" in msg
    assert "3 lines" in msg and "has 2" in msg
    assert "\n" not in msg


def test_trailing_newline_does_not_count_as_a_line(tmp_path):
    # 2 lines with a final newline vs 2 lines without: same count, no error.
    folder = write_corpus(tmp_path / "c", {"train.src": "a\nb\n", "train.tgt": "a\nb"})
    assert load_parallel_dir(folder)["train"] == (["a", "b"], ["a", "b"])


def test_empty_train_is_an_error(tmp_path):
    folder = write_corpus(tmp_path / "c", {"train.src": "", "train.tgt": ""})
    with pytest.raises(DataError) as e:
        load_parallel_dir(folder)
    assert "train.src" in str(e.value) and "empty" in str(e.value)


def test_empty_valid_and_test_are_allowed(tmp_path):
    folder = write_corpus(tmp_path / "c", {"valid.src": "", "valid.tgt": "", "test.src": "", "test.tgt": ""})
    data = load_parallel_dir(folder)
    assert data["valid"] == ([], []) and data["test"] == ([], [])


def test_invalid_utf8_names_file_and_line(tmp_path):
    bad = "ok line\nsecond ok\n".encode() + b"caf\xe9 latin-1\n" + "fourth\n".encode()
    folder = write_corpus(tmp_path / "c", {"train.tgt": bad, "train.src": "1\n2\n3\n4\n"})
    with pytest.raises(DataError) as e:
        load_parallel_dir(folder)
    msg = str(e.value)
    assert "train.tgt" in msg and "line 3" in msg and "UTF-8" in msg
    assert "\n" not in msg


def test_invalid_utf8_on_first_line_after_multibyte_text(tmp_path):
    # Multi-byte characters before the bad byte must not shift the line number.
    path = tmp_path / "x.txt"
    path.write_bytes("ñandú\n€€€\n".encode() + b"\xff\n")
    with pytest.raises(DataError, match=r"x\.txt line 3 "):
        read_lines(path)
    path.write_bytes(b"\x80abc")
    with pytest.raises(DataError, match=r"x\.txt line 1 "):
        read_lines(path)


def test_read_lines_splits_on_newline_only(tmp_path):
    # Form feed, vertical tab, U+2028 and U+0085 are line breaks for
    # str.splitlines but not for wc/sed: they must not add lines.
    path = tmp_path / "x.txt"
    path.write_text("a\x0cb\nc\u2028d\ne\x85f\ng\x0bh\n", encoding="utf-8")
    assert read_lines(path) == ["a b", "c d", "e f", "g h"]


def test_read_lines_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_lines(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="is a folder"):
        read_lines(tmp_path)


def test_read_lines_empty_file(tmp_path):
    (tmp_path / "e").write_bytes(b"")
    assert read_lines(tmp_path / "e") == []
    (tmp_path / "n").write_bytes(b"\n")
    assert read_lines(tmp_path / "n") == [""]


def test_data_error_is_value_error():
    assert issubclass(DataError, ValueError)


def test_write_then_load_round_trip(tmp_path):
    splits = {"train": (["a b", "c"], ["x", "y z"]), "valid": (["v"], ["w"]), "test": ([], [])}
    folder = write_parallel_dir(tmp_path / "out", splits)
    assert load_parallel_dir(folder) == splits


line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=40)


@settings(max_examples=60, deadline=None)
@given(st.lists(line_text, min_size=1, max_size=8))
def test_any_text_reads_back_normalised(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("h") / "f.txt"
    path.write_bytes("\n".join(lines).encode("utf-8") + b"\n")
    got = read_lines(path)
    expected = [normalize_line(line) for line in lines]
    # A leading BOM is dropped as a byte order mark, not text.
    if lines[0].startswith("\ufeff"):
        expected[0] = normalize_line(lines[0][1:])
    assert got == expected
    for line in got:
        assert "  " not in line and line == line.strip()
