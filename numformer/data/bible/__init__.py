"""The real corpus ``bible-en-es``: English (World English Bible) to Spanish
(Reina-Valera 1909), verse-aligned, built from installed SWORD modules.

How the corpus is built (``build_bible_corpus``), each step in its own file:

1. Reading (:mod:`.sword`): each book of the 66-book (KJV) canon is read
   once from each of the two installed SWORD modules; the verse texts come
   with their (chapter, verse) reference from the module's own
   versification (NRSVA and KJV differ only in 3 John 1:15 and Rev 12:18,
   which exist in the English module alone).
2. Cleaning (:mod:`.osis`): the OSIS markup is stripped; notes, headings
   and the glossary go, Psalm superscriptions stay.
3. Pairing (:mod:`.pairing`): verses are paired by reference, except in
   chapters whose lengths show the Spanish numbering is shifted: there they
   are re-aligned by length (:mod:`numformer.data.alignment`, Gale & Church
   1993).
4. Filter (the length-ratio rule). With ``ratio`` = median of
   ``len(es)/len(en)`` (characters, about 0.96) and the normalised deviation
   ``d = (len(es) - ratio * len(en)) / (scale * sqrt((len(en) + len(es)) / 2))``
   where ``scale`` is the robust (MAD) spread of that deviation over all
   reference-aligned pairs (about 1.33), a pair is kept when both sides are
   non-empty and ``|d| <= MAX_DEVIATION`` (4.0). The deviation grows like
   the square root of the length, so short verses get a looser ratio bound
   than long ones (e.g. for 100 + 100 characters the kept ratio range is
   about 0.5-1.5, for 500 + 500 characters about 0.75-1.2).
5. Splits are whole books: valid = Esther, Daniel, Micah, 2 Corinthians,
   1 Peter; test = Judges, Ruth, Jonah, Acts, Philippians, James; all other
   books train. Pairs stay in canonical order (batching shuffles).

The result is written as a corpus folder (``train.src train.tgt valid.*
test.*``, source = English, target = Spanish) plus ``meta.json``, which is
written last and marks a complete build; later calls return at once. The
folder is ``environment.cache_root() / "bible-en-es"`` unless one is given.
``meta.json`` also records what the build read (:mod:`numformer.data.source_fingerprint`: path, size
and modification time of each module's ``.conf`` and data files): when the installed modules changed
since (an upgrade of the packages), the corpus is built again, and the log line names the file.
``python -m numformer.data.bible`` builds it and prints the counts
(:mod:`.__main__`).
"""

from __future__ import annotations

from pathlib import Path

from ... import environment
from ..alignment import estimate_length_model, length_deviation
from ..built_corpus import cached_build, holds_build, load_meta, write_meta
from ..source_fingerprint import changes, fingerprint, is_fingerprint, summary
from ..text_files import SPLITS
from .osis import clean_osis
from .pairing import SUSPECT_MEDIAN, align_book
from .sword import SRC_MODULE, TGT_MODULE, canon_books, find_sword_dir, module_files, open_modules, read_book

CORPUS_NAME = "bible-en-es"
#: Bumped whenever cleaning, alignment or filtering change: old caches are rebuilt.
FORMAT_VERSION = 2

#: Book names as pysword spells them (KJV canon).
VALID_BOOKS = ("Esther", "Daniel", "Micah", "II Corinthians", "I Peter")
TEST_BOOKS = ("Judges", "Ruth", "Jonah", "Acts", "Philippians", "James")

#: Keep a pair when |d| <= this (see the module docstring).
MAX_DEVIATION = 4.0


def default_cache_dir() -> Path:
    """``$NUMFORMER_CACHE/bible-en-es``, else ``$XDG_CACHE_HOME/numformer/bible-en-es``,
    else ``~/.cache/numformer/bible-en-es`` (:func:`numformer.environment.cache_root`)."""
    return environment.cache_root() / CORPUS_NAME


def cache_is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished build of this format (its ``meta.json`` says so)."""
    return holds_build(folder, CORPUS_NAME, FORMAT_VERSION)


def _read_clean(bible, book: str) -> dict[tuple[int, int], str]:
    """``{(chapter, verse): plain text}`` of one book."""
    return {ref: clean_osis(raw) for ref, raw in read_book(bible, book).items()}


def build_pairs(sword_path=None) -> tuple[dict[str, tuple[list[str], list[str]]], dict]:
    """Read, clean, align, filter and split the two bibles (no disk cache).

    Returns ``(splits, meta)``: ``splits`` maps train/valid/test to
    ``(english_lines, spanish_lines)``; ``meta`` holds counts and the
    length model.
    """
    src_bible, tgt_bible, sword_dir, confs = open_modules(sword_path)
    books = canon_books()
    src_books = {b: _read_clean(src_bible, b) for b in books}
    tgt_books = {b: _read_clean(tgt_bible, b) for b in books}

    # Length model from every reference-aligned non-empty pair.
    src_lens, tgt_lens = [], []
    for b in books:
        for ref, s in src_books[b].items():
            t = tgt_books[b].get(ref, "")
            if s and t:
                src_lens.append(len(s))
                tgt_lens.append(len(t))
    ratio, scale = estimate_length_model(src_lens, tgt_lens)

    splits = {split: ([], []) for split in SPLITS}
    stats = {"verse_refs": 0, "aligned_pairs": 0, "dropped_empty": 0, "dropped_length": 0,
             "realigned_chapters": 0, "moved_beads": 0}
    for b in books:
        stats["verse_refs"] += len(set(src_books[b]) | set(tgt_books[b]))
        pairs, book_stats = align_book(src_books[b], tgt_books[b], ratio, scale)
        stats["realigned_chapters"] += book_stats["realigned_chapters"]
        stats["moved_beads"] += book_stats["moved"]
        split = "valid" if b in VALID_BOOKS else "test" if b in TEST_BOOKS else "train"
        src_out, tgt_out = splits[split]
        for s, t in pairs:
            if not s or not t:
                stats["dropped_empty"] += 1
                continue
            stats["aligned_pairs"] += 1
            if abs(float(length_deviation(len(s), len(t), ratio, scale))) > MAX_DEVIATION:
                stats["dropped_length"] += 1
                continue
            src_out.append(s)
            tgt_out.append(t)
    meta = {
        "name": CORPUS_NAME,
        "format_version": FORMAT_VERSION,
        "source": {"module": SRC_MODULE, "version": confs[SRC_MODULE].get("version"), "lang": "en"},
        "target": {"module": TGT_MODULE, "version": confs[TGT_MODULE].get("version"), "lang": "es"},
        "sword_path": str(sword_dir),
        "valid_books": list(VALID_BOOKS),
        "test_books": list(TEST_BOOKS),
        "length_model": {"ratio": ratio, "scale": scale, "max_deviation": MAX_DEVIATION,
                         "suspect_median": SUSPECT_MEDIAN},
        "stats": stats,
        "counts": {split: len(splits[split][0]) for split in SPLITS},
    }
    return splits, meta


def build_bible_corpus(cache_dir=None, force: bool = False, sword_path=None, log=None) -> Path:
    """Build (or find in the cache) the ``bible-en-es`` corpus folder.

    Args:
        cache_dir: the folder to hold ``train.src train.tgt valid.* test.*``
            (English source, Spanish target) and ``meta.json``; default
            :func:`default_cache_dir`.
        force: rebuild even if a complete build of this format is there.
        sword_path: a SWORD data folder (with ``mods.d/``) holding both
            modules; default ``$SWORD_PATH``, ``/usr/share/sword``, ``~/.sword``.
        log: called with one line when a cached build is rebuilt because its modules changed.
    Returns:
        The folder, ready for :func:`numformer.data.load_parallel_dir`.
    Raises:
        DataError: pysword or the SWORD modules are missing (the message
            gives the install command).
    """
    def build():
        splits, meta = build_pairs(sword_path)
        meta["sources"] = fingerprint(module_files(Path(meta["sword_path"])))
        return splits, meta

    return cached_build(cache_dir if cache_dir is not None else default_cache_dir(), CORPUS_NAME, FORMAT_VERSION,
                        build, lambda folder: modules_changed(folder, sword_path), force=force, log=log)


def modules_changed(folder: Path, sword_path=None) -> str | None:
    """What changed in the SWORD modules since the build in ``folder`` (one line's worth), or None when
    they are the files it was read from, or are gone (then the build is all that is left of them: kept).

    A build from before ``meta.json`` recorded its files is compared by the modules' versions, and when
    they agree the files' record is added to it (the cache is not rebuilt for want of a record)."""
    sword_dir = find_sword_dir(sword_path)
    if sword_dir is None:
        return None
    meta = load_meta(folder)
    now = fingerprint(module_files(sword_dir))
    recorded = meta.get("sources")
    if not is_fingerprint(recorded):
        versions = {m: _conf_version(sword_dir, m) for m in (SRC_MODULE, TGT_MODULE)}
        built = {meta.get(side, {}).get("module"): meta.get(side, {}).get("version") for side in ("source", "target")}
        differ = [f"{m} {built.get(m)} -> {v}" for m, v in versions.items() if built.get(m) != v]
        if differ:
            return f"the SWORD modules changed version ({', '.join(differ)})"
        meta["sources"] = now
        write_meta(folder, meta)
        return None
    found = [c for c in changes(recorded, now) if not c.gone]
    return summary(found) if found else None


def _conf_version(sword_dir: Path, module: str) -> str | None:
    """The ``Version=`` of a module's ``.conf`` (what pysword reports as its version), None without one."""
    for conf in module_files(sword_dir):
        if conf.suffix == ".conf" and f"[{module}]" in (text := conf.read_text(encoding="utf-8", errors="replace")):
            for line in text.splitlines():
                if line.strip().lower().startswith("version="):
                    return line.split("=", 1)[1].strip()
    return None
