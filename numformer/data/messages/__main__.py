"""``python -m numformer.data.messages [--out DIR] [--force] [--locale-dir DIR]``: build the messages-en-es
corpus (or find it in the cache) and print its counts."""

from __future__ import annotations

import sys
from pathlib import Path

from ...cli.front import command_line, parser as command_parser
from ..built_corpus import print_build, timed_build
from . import CORPUS_NAME, MAX_DEVIATION, build_messages_corpus, default_cache_dir
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
    folder, meta, cached, elapsed = timed_build(
        args.out if args.out is not None else default_cache_dir(),
        lambda folder: build_messages_corpus(folder, locale_dir=args.locale_dir, log=print, force=args.force))
    stats, set_aside = meta["stats"], meta["set_aside"]
    print_build(CORPUS_NAME, folder, meta, cached, elapsed, [
        f"read {len(meta['catalogs'])} catalogs ({stats['entries']} entries); set aside {len(set_aside)} lists of names "
        f"({sum(c['entries'] or 0 for c in set_aside.values())} entries)"
        + (f"; skipped {len(meta['skipped'])} damaged" if meta["skipped"] else ""),
        f"dropped {stats['plural']} plural, {stats['untranslated']} untranslated, {stats['no_letters']} without a "
        f"letter, {stats['identical']} the same in both languages, {stats['too_long']} over {MAX_WORDS} words, "
        f"{stats['length_ratio']} by the length rule (|d| > {MAX_DEVIATION}), {stats['duplicate']} repeated English "
        "messages"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
