"""A corpus the project builds itself (``bible-en-es``, ``messages-en-es``), cached in a folder: the six text files
(``train.src train.tgt valid.* test.*``), then ``meta.json``, written last, which marks the build complete and
records its name, format version, counts and what it was read from.

A build writes only into a folder that is empty, new, or holds a build of the same corpus (finished, older or
interrupted): while it writes, ``meta.json`` says ``"building": true``. A folder holding the text files of
another corpus (another build's ``meta.json``, or the six files with no ``meta.json``: a user's own corpus) is
refused in one line, since the build would overwrite them (:func:`refuse_foreign_folder`).

:func:`cached_build` is the one way every builder goes: a complete build of this name and format whose sources
did not change is reused; otherwise the corpus is built again (the log names what changed) and written, its
``meta.json`` first replaced by one that says it is building and written whole last, so that an interrupted
rebuild is never taken for a finished one.
:func:`timed_build` and :func:`print_build` are the builders' ``python -m`` commands' shared half.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..files import atomic_write_text
from .errors import DataError
from .text_files import CORPUS_FILES, SPLITS, write_parallel_dir

META_FILE = "meta.json"


def load_meta(folder) -> dict:
    """The ``meta.json`` of the build in ``folder``."""
    return json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))


def write_meta(folder, meta: dict) -> None:
    """Write ``folder``'s ``meta.json`` atomically."""
    atomic_write_text(Path(folder) / META_FILE, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


def holds_build(folder, name: str, format_version: int) -> bool:
    """Whether ``folder`` holds a finished build of corpus ``name`` in this format (its ``meta.json`` says so)."""
    folder = Path(folder)
    if not all((folder / f).is_file() for f in CORPUS_FILES):
        return False
    try:
        meta = load_meta(folder)
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and meta.get("name") == name and meta.get("format_version") == format_version
            and not meta.get("building"))


def refuse_foreign_folder(folder, name: str) -> None:
    """Raise a one-line DataError when building corpus ``name`` into ``folder`` would overwrite text files that
    are not a build of it: another corpus's build, or corpus files without a ``meta.json`` (a user's own)."""
    folder = Path(folder)
    try:
        meta = load_meta(folder)
    except FileNotFoundError:
        meta = None
    except (OSError, ValueError):
        return  # a damaged meta.json: a build of ours went wrong there, and a new one replaces it
    if isinstance(meta, dict) and meta.get("name") == name:
        return
    if meta is not None:
        held = f"a build of {meta.get('name')}" if isinstance(meta, dict) and meta.get("name") else "a meta.json"
    else:
        present = [f for f in CORPUS_FILES if (folder / f).exists()]
        if not present:
            return
        held = f"corpus files no build wrote ({', '.join(present)})"
    raise DataError(f"{folder} holds {held}: building {name} there would overwrite them: give a new or empty "
                    "folder (--out DIR)")


def cached_build(folder, name: str, format_version: int, build, changed, force: bool = False, log=None) -> Path:
    """``folder`` holding a complete build of corpus ``name``: the cached one, or a new one.

    ``build()`` -> ``(splits, meta)`` makes the corpus (``splits``: split -> (source lines, target lines));
    ``changed(folder)`` -> what changed in its sources since the cached build (one line's worth), or None when
    it can be kept; ``force`` builds again regardless; ``log`` hears why a cached build is built again.
    """
    folder = Path(folder)
    refuse_foreign_folder(folder, name)
    if not force and holds_build(folder, name, format_version):
        what = changed(folder)
        if what is None:
            return folder
        (log or (lambda *a: None))(f"{name}: {what} since {folder} was built: building it again")
    start = time.perf_counter()
    splits, meta = build()
    folder.mkdir(parents=True, exist_ok=True)
    # an interrupted rebuild must not pass for a finished one, nor for a user's own files: it says it is building
    write_meta(folder, {"name": name, "format_version": format_version, "building": True})
    write_parallel_dir(folder, splits)
    meta["build_seconds"] = round(time.perf_counter() - start, 2)
    write_meta(folder, meta)
    return folder


def _meta_stamp(folder):
    """Which ``meta.json`` is in ``folder`` now (None when there is none): a rebuild writes a new file."""
    try:
        st = (Path(folder) / META_FILE).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def timed_build(folder, build) -> tuple[Path, dict, bool, float]:
    """``build(folder)`` builds the corpus into ``folder`` or finds it there, and returns it ->
    ``(folder, its meta, whether the cached build was kept, seconds taken)``."""
    before = _meta_stamp(folder)
    start = time.perf_counter()
    folder = build(folder)
    elapsed = time.perf_counter() - start
    return folder, load_meta(folder), before is not None and _meta_stamp(folder) == before, elapsed


def print_build(name: str, folder, meta: dict, cached: bool, elapsed: float, details, target: str = "Spanish") -> None:
    """A build's report: the pairs per split, the builder's own ``details`` lines, where it came from."""
    print(f"{name} (English -> {target}) in {folder}")
    for split in SPLITS:
        print(f"  {split:5s} {meta['counts'][split]:6d} pairs")
    for line in details:
        print(f"  {line}")
    if cached:
        print(f"  found in the cache in {elapsed:.2f} s (built in {meta['build_seconds']:.1f} s); --force rebuilds")
    else:
        print(f"  built in {elapsed:.1f} s")
