"""Reading a parallel corpus folder: ``train.src train.tgt valid.* test.*``.

Each file holds one sentence per line, UTF-8; line ``i`` of ``X.src`` is
translated by line ``i`` of ``X.tgt``. Reading normalises each line the same
way everywhere (training, evaluation, translate.py), so the text the
vocabulary sees is the text the model is evaluated on:

- the trailing ``\\n`` and any ``\\r`` before it are dropped (CRLF files read as LF ones);
- a UTF-8 byte order mark (U+FEFF) at the start of the file, and at the start of any line (two files
  joined with ``cat``: Python does not count it as whitespace, so it became a vocabulary piece), is dropped;
- a file with no ``\\n`` at all that holds a ``\\r`` has old Mac line endings: it is split on ``\\r`` (it
  was one line before; a last line without its ``\\r`` is a line too: such a file was still one line, and a
  training file of them one pair, at 4439216);
- runs of whitespace inside a line become one space; leading and trailing
  whitespace is removed.

Lines are split on ``\\n`` only (on ``\\r`` in an old Mac file; not on the other characters that
``str.splitlines`` treats as line breaks, such as form feed or U+2028), so
line numbers in messages match what ``wc -l``, editors and ``sed -n Np`` see.
Empty lines are kept, so line ``i`` of an output file can be matched to line
``i`` of the input.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..file_kinds import FOLDER, MODEL_FILE, RUN_FOLDER, kind_of, shown
from ..files import atomic_write_text
from .errors import DataError


@contextlib.contextmanager
def _file_errors(path: Path):
    """An OSError while opening or reading ``path`` becomes a one-line DataError saying what to check."""
    try:
        yield
    except FileNotFoundError:
        raise DataError(f"file not found: {path}: check the path") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, expected a text file with one sentence per line") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}: check the file's permissions") from None


#: Split names, in the order they are returned.
SPLITS = ("train", "valid", "test")
#: The file-name suffixes of the two sides.
SIDES = ("src", "tgt")
#: Every file a corpus folder must contain.
CORPUS_FILES = tuple(f"{split}.{side}" for split in SPLITS for side in SIDES)


#: The byte order mark, which ``str.split()`` does not take for whitespace.
BOM = "\ufeff"


def normalize_line(line: str) -> str:
    """Collapse whitespace runs to one space, strip both ends, and drop U+FEFF at the line's start.

    ``str.split()`` with no argument splits on every Unicode whitespace
    character, so tabs, non-breaking spaces and stray ``\\r`` all go; a U+FEFF
    at the start (a file's byte order mark left mid-file by ``cat a b``) is
    not whitespace to Python and would become a piece of its own.
    """
    text = " ".join(line.split())
    while text.startswith(BOM):
        text = " ".join(text[1:].split())
    return text


def cr_only(text: str) -> bool:
    """True for text with old Mac line endings: no ``\\n`` anywhere, and a ``\\r`` in it (its last line may lack
    one). A ``\\r`` inside a line of a file that has a ``\\n`` stays whitespace."""
    return "\n" not in text and "\r" in text


def read_lines(path, fixes: dict | None = None) -> list[str]:
    """Read a UTF-8 text file into a list of normalised lines.

    Args:
        path: file to read (str or Path).
    Returns:
        One string per line (``\\n``-separated; a final newline does not add
        an empty line), each passed through :func:`normalize_line`.
    Raises:
        DataError: the file is missing or unreadable, or holds bytes that are
            not UTF-8 (the message names the file and the 1-based line).
    """
    path = Path(path)
    with _file_errors(path):
        data = path.read_bytes()
    return split_lines(data, str(path), fixes=fixes)


def split_lines(data: bytes, name: str, first_line: int = 1, normalize: bool = True,
                strip_bom: bool = True, whole: bool = True, fixes: dict | None = None) -> list[str]:
    """UTF-8 bytes -> normalised lines, as :func:`read_lines` does for a file (``name`` is for messages).

    Splits on ``\\n`` only; a final newline does not add an empty line; a leading BOM is dropped.
    Raises DataError naming ``name`` and the 1-based line when the bytes are not UTF-8;
    ``first_line`` is the line number of the first line of ``data`` (a block of a longer file).
    ``normalize=False`` returns the lines as they are (for a caller that normalises only some);
    ``strip_bom=False`` keeps a leading U+FEFF (a block that does not start the file).
    ``whole``: ``data`` is the whole file, so old Mac line endings (:func:`cr_only`) can be told; False for a
    block of a longer file. ``fixes``: a dict that counts what the reading repaired (:func:`count_fixes`).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        # Locate the bad byte by counting newlines before it: cheaper than
        # decoding line by line, and exact because b"\n" never occurs inside
        # a multi-byte UTF-8 sequence.
        line_no = data.count(b"\n", 0, e.start) + first_line
        line_start = data.rfind(b"\n", 0, e.start) + 1
        column = e.start - line_start + 1
        bad = data[e.start:e.end].hex()
        fname = Path(name).name if Path(name).is_file() else "FILE"  # "FILE" for standard input
        raise DataError(
            f"{name} line {line_no} is not valid UTF-8 (byte 0x{bad} at byte column {column}): "
            f"re-encode it as UTF-8, e.g. `iconv -f latin1 -t utf-8 {fname} > {fname}.utf8`"
        ) from None
    if strip_bom and text.startswith(BOM):
        text = text[1:]
    if not text:
        return []
    old_mac = whole and cr_only(text)
    if fixes is not None:
        count_fixes(fixes, text, old_mac)
    lines = text.split("\r" if old_mac else "\n")
    if lines[-1] == "":
        # The data ends with a newline: that terminates the last line, it
        # does not start a new, empty one.
        lines.pop()
    return [normalize_line(line) for line in lines] if normalize else lines


#: What :func:`count_fixes` counts: the keys of a preparation's record and log line.
FIXES = ("bom_lines", "crlf_lines", "cr_only_lines")


def count_fixes(fixes: dict, text: str, old_mac: bool) -> None:
    """Add to ``fixes`` what reading ``text`` repairs: lines starting with U+FEFF (a file's own mark at its
    start is not counted: it is what the mark is for), lines ending in CRLF, lines split on a lone CR."""
    fixes["bom_lines"] = fixes.get("bom_lines", 0) + text.count("\n" + BOM) + text.count("\r" + BOM) * old_mac \
        + text.startswith(BOM)
    fixes["crlf_lines"] = fixes.get("crlf_lines", 0) + text.count("\r\n")
    fixes["cr_only_lines"] = fixes.get("cr_only_lines", 0) + (text.count("\r") if old_mac else 0)


#: Bytes read at a time by :func:`iter_line_blocks` and :func:`count_lines`.
BLOCK_BYTES = 1 << 23


def iter_line_blocks(path, block_bytes: int = BLOCK_BYTES, normalize: bool = True, *, fixes: dict | None = None):
    """Stream a UTF-8 text file as blocks of lines: yields (number of lines before the block, lines).

    The same lines, split and normalised the same way, as :func:`read_lines` (whose errors it
    raises too, with the file's own line numbers), holding one block of about ``block_bytes`` at
    a time instead of the whole file. ``fixes``: counts what was repaired (:func:`count_fixes`).
    An old Mac file has no ``\\n``, so it arrives whole as the last block, where it is told.
    """
    path = Path(path)
    with _file_errors(path):
        f = open(path, "rb")
    with f:
        done, rest, first = 0, b"", True
        while True:
            block = f.read(block_bytes)
            data = rest + block
            if not block:
                if data:  # a last line without its newline (or, when first, a whole file without one)
                    lines = split_lines(data, str(path), done + 1, normalize, strip_bom=first, whole=first,
                                        fixes=fixes)
                    yield done, lines
                return
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # no newline yet: a line longer than a block, keep reading
                rest = data
                continue
            data, rest = data[:cut], data[cut:]
            lines = split_lines(data, str(path), done + 1, normalize, strip_bom=first, whole=False, fixes=fixes)
            first = False
            yield done, lines
            done += len(lines)


def count_lines(path, block_bytes: int = BLOCK_BYTES) -> int:
    """How many lines :func:`read_lines` would return for ``path``, from the bytes alone (fast)."""
    n, last, size, cr = 0, b"\n", 0, 0
    with open(path, "rb") as f:
        head = f.read(3)
        if head != b"\xef\xbb\xbf":  # a BOM is not part of the first line
            n, last, size, cr = head.count(b"\n"), head[-1:] or b"\n", len(head), head.count(b"\r")
        while block := f.read(block_bytes):
            n += block.count(b"\n")
            cr += block.count(b"\r") if not n else 0  # counted only while the file may be an old Mac one
            last, size = block[-1:], size + len(block)
    if not n and cr:  # old Mac line endings (text_files.cr_only): one line per \r, and a last one without it
        return cr + (last != b"\r")
    return n + (1 if size and last != b"\n" else 0)


def check_corpus_dir(path) -> Path:
    """``path`` as a Path if it is a folder holding the six corpus files; else DataError (one line). A path of
    another kind (a text file, a model file, a run folder: :func:`numformer.file_kinds.kind_of`) is named as what
    it is, with what to give instead, rather than as a corpus folder that lacks its files."""
    folder = Path(path)
    expected = " ".join(CORPUS_FILES)
    p = shown(path)
    if not folder.exists():
        raise DataError(f"corpus folder {p} does not exist: create it with the files {expected}")
    missing = [name for name in CORPUS_FILES if not (folder / name).is_file()] if folder.is_dir() else None
    if missing is None or (missing and kind_of(folder) is not FOLDER):
        kind = kind_of(folder)
        hint = {RUN_FOLDER: f" (to continue that run: train.py --out {p} --resume)",
                MODEL_FILE: " (a model to fine-tune goes to train.py --init-from)"}.get(kind, "")
        raise DataError(f"{p} is {kind.what}, not a corpus folder: give the folder that holds {expected}{hint}")
    if missing:
        raise DataError(
            f"corpus folder {p} lacks {', '.join(missing)}: "
            f"a corpus folder needs {expected} (one sentence per line, UTF-8)"
        )
    return folder


def count_pairs(folder) -> dict[str, int]:
    """Line counts per split of a corpus folder, from the bytes alone (:func:`count_lines`).

    Raises:
        DataError: a ``.src`` and its ``.tgt`` have different line counts, or ``train.*`` is empty.
    """
    folder = Path(folder)
    counts = {}
    for split in SPLITS:
        src_path, tgt_path = folder / f"{split}.src", folder / f"{split}.tgt"
        n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
        if n_src != n_tgt:
            raise DataError(
                f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}: line i of {split}.src must be the "
                f"translation of line i of {split}.tgt, fix the files so the counts match")
        if split == "train" and not n_src:
            raise DataError(f"{src_path} and {tgt_path} are empty: the training split needs at least one "
                            "sentence pair")
        counts[split] = n_src
    return counts


def load_parallel_dir(path) -> dict[str, tuple[list[str], list[str]]]:
    """Read the six files of a parallel corpus folder.

    Args:
        path: folder holding ``train.src train.tgt valid.src valid.tgt
            test.src test.tgt``.
    Returns:
        ``{"train": (src_lines, tgt_lines), "valid": (...), "test": (...)}``;
        in each pair ``len(src_lines) == len(tgt_lines)``; lines are
        normalised as described in the module docstring.
    Raises:
        DataError: the folder or one of the files is missing, a ``.src`` and
            its ``.tgt`` have different line counts, ``train.*`` is empty, or
            a file is not UTF-8.
    """
    folder = check_corpus_dir(path)
    out = {}
    for split in SPLITS:
        src_path, tgt_path = folder / f"{split}.src", folder / f"{split}.tgt"
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            raise DataError(
                f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
                f"line i of {split}.src must be the translation of line i of {split}.tgt, fix the files so the counts match"
            )
        if split == "train" and not src:
            raise DataError(
                f"{src_path} and {tgt_path} are empty: the training split needs at least one sentence pair"
            )
        out[split] = (src, tgt)
    return out


def write_parallel_dir(path, splits: dict[str, tuple[list[str], list[str]]]) -> Path:
    """Write ``{split: (src_lines, tgt_lines)}`` as a corpus folder.

    The inverse of :func:`load_parallel_dir` for normalised lines (used by
    the bible builder and tests). Creates the folder if needed; overwrites
    the six files, each atomically (:mod:`numformer.files`). Lines must not
    contain ``\\n``. Returns the folder.
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        src, tgt = splits[split]
        if len(src) != len(tgt):
            raise ValueError(f"split {split}: {len(src)} source lines but {len(tgt)} target lines")
        for side, lines in zip(SIDES, (src, tgt)):
            for line in lines:
                if "\n" in line:
                    raise ValueError(f"split {split}.{side}: a line contains a newline: {line!r}")
            atomic_write_text(folder / f"{split}.{side}", "".join(line + "\n" for line in lines))
    return folder
