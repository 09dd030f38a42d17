"""The real corpus ``messages-en-es``: English to Spanish program messages, from the gettext message
catalogs installed on the machine (``/usr/share/locale/es*/LC_MESSAGES/*.mo``).

Technical text (errors, warnings, option help, menu labels of coreutils, git, apt, dpkg, bash, tar,
PostgreSQL, GLib, GTK, systemd, ...), not the Bible: a second corpus, of another kind, so that a training
recipe is not tuned to one. How it is built (``build_messages_corpus``), each step in its own file:

1. Finding (:mod:`.catalogs`): every ``.mo`` under ``es``, ``es_*`` of ``/usr/share/locale`` and
   ``/usr/share/locale-langpack``, each file once (links followed), read in a fixed order (by catalog
   name, then folder, then locale).
   Catalogs that list names rather than sentences are set aside: ``iso_*`` (countries, languages,
   scripts, currencies) and ``xkeyboard-config`` (keyboard layouts).
2. Reading (:mod:`.mo_file`): the binary catalog, with the stdlib. Skipped: the header (empty msgid),
   plural entries (their forms are not one sentence each), untranslated entries (empty msgstr). A
   context (``msgctxt``) is dropped, its message kept.
3. Cleaning (:mod:`.cleaning`): one line per message, GTK's ``_`` access-key markers removed in the
   catalogs that use them (gtk20 and software-properties here), placeholders (``%s``, ``{0}``) kept;
   dropped: an English side without a letter outside its placeholders, the two sides the same after
   cleaning, more than ``MAX_WORDS`` (100) words on a side.
4. Length rule: ``d`` of :func:`numformer.data.alignment.length_deviation` (characters), with ``ratio``
   and ``scale`` estimated robustly over the pairs of step 3 (``scale`` at least ``MIN_SCALE``, 1.0), a
   pair is kept when ``|d| <= MAX_DEVIATION`` (4.0), as in the bible corpus. It mostly drops
   translations that add a sentence (``Report bugs to: %s`` with the translation team's address added).
5. Deduplication by English text: the same message appears in several programs (``memory exhausted``);
   the first translation in the reading order that passed steps 3 and 4 is kept.
6. Splits by a hash of the English text: ``sha256`` of its UTF-8, the first 8 bytes as an integer, modulo
   1,000: below ``VALID_PER_MILLE`` (25) valid, below twice that test, the rest train. A message lands
   in the same split whatever other catalogs are installed, and the same English is never in two splits.
   Pairs are written in reading order.

Measured on this machine (Debian 12; 86 ``.mo`` files under ``/usr/share/locale/es``, none under ``es_*``
or ``locale-langpack``): the name lists are 12 of the files, 8 once links are followed (``iso_3166.mo`` ->
``iso_3166-1.mo``, ...), holding 3,639 entries (iso_* 2,432, xkeyboard-config 1,207): set aside. The 74
others hold 45,756 entries (header aside): 248 plural and 9 untranslated are skipped; of the 45,499 left,
120 have no letter in English outside placeholders, 896 are the same in both languages, 69 are longer than
100 words on a side, 144 fail the length rule (ratio 1.20, scale 1.03) and 2,073 repeat an English message
read before. Kept: 42,197 pairs, 40,094 train / 1,062 valid / 1,041 test; 6.8 English and 8.3 Spanish words
a pair on average (the bible's verses: 24 English words); postgres-15 (5,488), git (5,210) and gas (4,224) give the
most. Built in about 1.6 s. ``python -m numformer.data.messages`` prints the counts of the build it finds or
makes.

The same steps build English to another language from that language's catalogs (``python -m
numformer.data.messages --language de --out DIR``, then ``train.py --data DIR``): a corpus of the user's
kind that the budget recipe was not tuned on (issue 43's check). Only the Spanish one is a registered corpus.

The result is written as a corpus folder (``train.src train.tgt valid.* test.*``, source = English,
target = Spanish) plus ``meta.json``, which is written last and marks a complete build; later calls return
at once. The folder is ``environment.cache_root() / "messages-en-es"`` unless one is given. ``meta.json``
records the catalogs read (:mod:`numformer.data.source_fingerprint`: path, size and modification time of
each): when a catalog changed or a new one appeared since (a package upgraded or installed), the corpus is
built again and the log line names the file; a catalog that is gone keeps the build (it is all that is left
of it).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ... import environment
from ..alignment import estimate_length_model, length_deviation
from ..built_corpus import cached_build, holds_build, load_meta
from ..errors import DataError
from ..source_fingerprint import changes, fingerprint, is_fingerprint, summary
from ..text_files import SPLITS
from .catalogs import NAME_LISTS, SPANISH, find_catalogs, install_hint, language_name, locale_dirs
from .cleaning import MAX_WORDS, clean_message, drop_reason, uses_mnemonics
from .mo_file import MoFileError, read_mo


def corpus_name(language: str = SPANISH) -> str:
    """``messages-en-es`` (:data:`CORPUS_NAME`, the registered corpus), ``messages-en-de`` for German, ..."""
    return f"messages-en-{language}"


#: The registered corpus's name.
CORPUS_NAME = corpus_name(SPANISH)
#: Bumped whenever reading, cleaning, filtering or splitting change: old caches are rebuilt.
FORMAT_VERSION = 1
#: Keep a pair when |d| <= this (see the module docstring).
MAX_DEVIATION = 4.0
#: The least spread the length rule assumes: catalogs of near-identical messages (a few programs, or a test's)
#: would otherwise measure a spread near 0 and drop every pair off their one ratio.
MIN_SCALE = 1.0
#: Per mille of the English messages (by hash) in valid, and as many again in test.
VALID_PER_MILLE = 25

#: The counters of ``meta.json``'s ``stats``, in the order the build applies them.
STAT_KEYS = ("entries", "plural", "untranslated", "no_letters", "identical", "too_long", "length_ratio",
             "duplicate", "kept")


def default_cache_dir(language: str = SPANISH) -> Path:
    """``$NUMFORMER_CACHE/messages-en-es``, else ``$XDG_CACHE_HOME/numformer/messages-en-es``, else
    ``~/.cache/numformer/messages-en-es`` (:func:`numformer.environment.cache_root`); ``-de`` for German."""
    return environment.cache_root() / corpus_name(language)


def cache_is_complete(folder: Path, language: str = SPANISH) -> bool:
    """Whether ``folder`` holds a finished build of this format (its ``meta.json`` says so)."""
    return holds_build(folder, corpus_name(language), FORMAT_VERSION)


def split_of(english: str) -> str:
    """``"valid"``, ``"test"`` or ``"train"``: the split of a pair, from a hash of its English text alone."""
    bucket = int.from_bytes(hashlib.sha256(english.encode("utf-8")).digest()[:8], "big") % 1000
    return "valid" if bucket < VALID_PER_MILLE else "test" if bucket < 2 * VALID_PER_MILLE else "train"


def usable_catalogs(locale_dir=None, language: str = SPANISH) -> tuple[list, list, list[Path]]:
    """``(read, set_aside, folders)``: the catalogs the corpus reads, the name lists it sets aside, and the
    locale folders searched.

    Raises:
        DataError: no catalog of ``language`` is installed, or only name lists are (one line saying what to
            install).
    """
    folders = locale_dirs(locale_dir, language)
    found = find_catalogs(folders, language)
    read = [c for c in found if not c.is_name_list]
    where = " or ".join(str(f) for f in folders) or "/usr/share/locale"
    if not found:
        raise DataError(f"no {language_name(language)} message catalogs ({language}*/LC_MESSAGES/*.mo) under "
                        f"{where}: {install_hint(language)}")
    if not read:
        raise DataError(f"the {language_name(language)} message catalogs under {where} are only lists of names "
                        f"({', '.join(NAME_LISTS)}): {install_hint(language)}")
    return read, [c for c in found if c.is_name_list], folders


def build_pairs(locale_dir=None, log=None,
                language: str = SPANISH) -> tuple[dict[str, tuple[list[str], list[str]]], dict]:
    """Find, read, clean, filter, deduplicate and split the catalogs (no disk cache).

    Returns ``(splits, meta)``: ``splits`` maps train/valid/test to ``(english_lines, target_lines)`` (the
    target in ``language``, Spanish unless asked);
    ``meta`` holds the counts, the catalogs read and set aside, and the length model. A catalog that
    cannot be read as a ``.mo`` file is skipped, named in ``meta["skipped"]`` and to ``log``.
    """
    log = log or (lambda *a: None)
    name = corpus_name(language)
    catalogs, set_aside, folders = usable_catalogs(locale_dir, language)
    sources = fingerprint(c.path for c in catalogs)  # before reading: a catalog written meanwhile is seen as changed
    stats = dict.fromkeys(STAT_KEYS, 0)
    candidates = []  # (catalog index, english, target) after step 3
    per_catalog, skipped = {}, []
    for index, catalog in enumerate(catalogs):
        try:
            entries = [e for e in read_mo(catalog.path) if e.msgid]
        except MoFileError as e:
            skipped.append({"catalog": str(catalog), "path": str(catalog.path), "why": str(e)})
            log(f"{name}: skipping {e}")
            continue
        except OSError as e:
            raise DataError(f"cannot read {catalog.path}: {e.strerror}: make it readable, or train on your own "
                            "corpus with --data DIR") from None
        mnemonics = uses_mnemonics(e.msgid for e in entries)
        per_catalog[str(catalog)] = {"path": str(catalog.path), "entries": len(entries), "mnemonics": mnemonics,
                                     "kept": 0}
        stats["entries"] += len(entries)
        for entry in entries:
            if entry.plural:
                stats["plural"] += 1
                continue
            if not entry.msgstr.strip():
                stats["untranslated"] += 1
                continue
            english, target = clean_message(entry.msgid, mnemonics), clean_message(entry.msgstr, mnemonics)
            reason = drop_reason(english, target)
            if reason:
                stats[reason] += 1
                continue
            candidates.append((index, english, target))
    if not candidates:
        raise DataError(f"the {language_name(language)} message catalogs under {' or '.join(map(str, folders))} "
                        f"hold no usable translation: {install_hint(language)}")
    src_lens, tgt_lens = [len(e) for _, e, _ in candidates], [len(s) for _, _, s in candidates]
    ratio, scale = estimate_length_model(src_lens, tgt_lens)
    scale = max(scale, MIN_SCALE)
    deviation = length_deviation(src_lens, tgt_lens, ratio, scale)
    splits = {split: ([], []) for split in SPLITS}
    seen = set()
    for (index, english, target), d in zip(candidates, deviation.tolist()):
        if abs(d) > MAX_DEVIATION:
            stats["length_ratio"] += 1
            continue
        if english in seen:
            stats["duplicate"] += 1
            continue
        seen.add(english)
        stats["kept"] += 1
        per_catalog[str(catalogs[index])]["kept"] += 1
        src, tgt = splits[split_of(english)]
        src.append(english)
        tgt.append(target)
    meta = {
        "name": name,
        "format_version": FORMAT_VERSION,
        "source": {"lang": "en", "what": "msgid"},
        "target": {"lang": language, "what": "msgstr"},
        "locale_dirs": [str(f) for f in folders],
        "catalogs": per_catalog,
        "set_aside": {str(c): {"path": str(c.path), "entries": _entry_count(c.path)} for c in set_aside},
        "skipped": skipped,
        "rules": {"max_words": MAX_WORDS, "name_lists": list(NAME_LISTS), "valid_per_mille": VALID_PER_MILLE,
                  "test_per_mille": VALID_PER_MILLE, "split_hash": "sha256(english)[:8] % 1000"},
        "length_model": {"ratio": ratio, "scale": scale, "min_scale": MIN_SCALE, "max_deviation": MAX_DEVIATION},
        "stats": stats,
        "counts": {split: len(splits[split][0]) for split in SPLITS},
        "sources": sources,
    }
    return splits, meta


def _entry_count(path: Path) -> int | None:
    """How many entries (header aside) a set-aside catalog holds, for the record; None when unreadable."""
    try:
        return sum(1 for e in read_mo(path) if e.msgid)
    except (MoFileError, OSError):
        return None


def build_messages_corpus(folder=None, locale_dir=None, log=None, force: bool = False,
                          language: str = SPANISH) -> Path:
    """Build (or find in the cache) the ``messages-en-es`` corpus folder, or with another ``language`` its
    twin ``messages-en-LANGUAGE`` (a folder for ``--data``: only the Spanish one is a registered corpus).

    Args:
        folder: the folder to hold ``train.src train.tgt valid.* test.*`` (English source, target in
            ``language``) and ``meta.json``; default :func:`default_cache_dir`.
        locale_dir: the locale folder holding ``es/LC_MESSAGES/`` (and ``es_*``); default
            ``/usr/share/locale`` and ``/usr/share/locale-langpack``.
        language: the target language's locale code (default ``es``): catalogs under ``LANGUAGE``,
            ``LANGUAGE_*`` and ``LANGUAGE@*`` are read.
        log: called with one line when a cached build is rebuilt because its catalogs changed, or when a
            damaged catalog is skipped.
        force: rebuild even if a complete build of this format is there.
    Returns:
        The folder, ready for :func:`numformer.data.load_parallel_dir`.
    Raises:
        DataError: no catalogs of the language are installed, or a folder or catalog cannot be read (one line
            saying what to do).
    """
    return cached_build(folder if folder is not None else default_cache_dir(language), corpus_name(language),
                        FORMAT_VERSION, lambda: build_pairs(locale_dir, log=log, language=language),
                        lambda f: catalogs_changed(f, locale_dir, language), force=force, log=log)


def catalogs_changed(folder: Path, locale_dir=None, language: str = SPANISH) -> str | None:
    """What changed in the installed catalogs since the build in ``folder`` (one line's worth), or None when
    they are the files it was read from. A catalog that is gone does not count (the build is all that is left
    of it), nor do the name lists set aside; a new catalog does. A build whose ``meta.json`` has no record of
    its files is rebuilt."""
    meta = load_meta(folder)
    recorded = meta.get("sources")
    if not is_fingerprint(recorded):
        return "the build has no record of the catalogs it read"
    try:
        now = [c.path for c in find_catalogs(locale_dirs(locale_dir, language), language) if not c.is_name_list]
    except DataError:
        return None  # the locale folder is gone: keep the build
    found = [c for c in changes(recorded, fingerprint(now)) if not c.gone]
    return summary(found) if found else None
