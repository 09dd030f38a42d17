"""``python -m numformer.data.messages [--out DIR] [--force] [--locale-dir DIR]``: build the messages-en-es
corpus (or find it in the cache) and print its counts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...cli.front import command_line, parser as command_parser
from ..text_files import SPLITS
from . import (CORPUS_NAME, MAX_DEVIATION, build_messages_corpus, cache_is_complete, catalogs_changed,
               default_cache_dir, load_meta)
from .cleaning import MAX_WORDS


@command_line("python -m numformer.data.messages")
def main(argv=None) -> int:
    """``python -m numformer.data.messages [--out DIR] [--force] [--locale-dir DIR]``: build and print counts (a
    DataError: one line, exit 2)."""
    parser = command_parser("python -m numformer.data.messages",
                            description="Build the messages-en-es corpus (English -> Spanish) from the installed "
                                        "gettext catalogs.")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder for the corpus files (default {default_cache_dir()})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    parser.add_argument("--locale-dir", default=None,
                        help="locale folder holding es/LC_MESSAGES/ (default /usr/share/locale and "
                             "/usr/share/locale-langpack)")
    args = parser.parse_args(argv)
    folder = args.out if args.out is not None else default_cache_dir()
    cached = not args.force and cache_is_complete(folder) and catalogs_changed(folder, args.locale_dir) is None
    start = time.perf_counter()
    folder = build_messages_corpus(folder, locale_dir=args.locale_dir, log=print, force=args.force)
    elapsed = time.perf_counter() - start
    meta = load_meta(folder)
    counts, stats = meta["counts"], meta["stats"]
    set_aside = meta["set_aside"]
    print(f"{CORPUS_NAME} (English -> Spanish) in {folder}")
    for split in SPLITS:
        print(f"  {split:5s} {counts[split]:6d} pairs")
    print(f"  read {len(meta['catalogs'])} catalogs ({stats['entries']} entries); set aside {len(set_aside)} lists "
          f"of names ({sum(c['entries'] or 0 for c in set_aside.values())} entries)"
          + (f"; skipped {len(meta['skipped'])} damaged" if meta["skipped"] else ""))
    print(f"  dropped {stats['plural']} plural, {stats['untranslated']} untranslated, {stats['no_letters']} without "
          f"a letter, {stats['identical']} the same in both languages, {stats['too_long']} over {MAX_WORDS} words, "
          f"{stats['length_ratio']} by the length rule (|d| > {MAX_DEVIATION}), {stats['duplicate']} repeated "
          "English messages")
    if cached:
        print(f"  found in the cache in {elapsed:.2f} s (built in {meta['build_seconds']:.1f} s); --force rebuilds")
    else:
        print(f"  built in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
