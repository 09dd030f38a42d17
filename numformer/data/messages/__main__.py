"""``python -m numformer.data.messages [--out DIR] [--force] [--locale-dir DIR] [--language CODE]``: build the
messages-en-es corpus (or find it in the cache) and print its counts; with ``--language de``, its German twin
messages-en-de, a folder for ``train.py --data``."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ...cli.front import command_line, parser as command_parser
from ..built_corpus import print_build, timed_build
from . import MAX_DEVIATION, build_messages_corpus, corpus_name, default_cache_dir
from .catalogs import SPANISH, language_name
from .cleaning import MAX_WORDS


def locale_code(text: str) -> str:
    """A locale folder's language code as ``--language`` takes it: two or three lowercase letters (``de``,
    ``fr``, ``ast``), the part of ``de_DE`` before ``_``."""
    if not re.fullmatch(r"[a-z]{2,3}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a language code: give two or three lowercase letters, "
                                         "as the locale folders name them (de, fr, pt for pt_BR)")
    return text


@command_line("python -m numformer.data.messages")
def main(argv=None) -> int:
    """``python -m numformer.data.messages [--out DIR] [--force] [--locale-dir DIR] [--language CODE]``: build and
    print counts (a DataError: one line, exit 2)."""
    parser = command_parser("python -m numformer.data.messages",
                            description="Build the messages-en-es corpus (English -> Spanish) from the installed "
                                        "gettext catalogs, or with --language English -> another language.")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder for the corpus files (default {default_cache_dir()}, or -de for German, ...)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    parser.add_argument("--locale-dir", default=None,
                        help="locale folder holding es/LC_MESSAGES/ (or --language's; default /usr/share/locale and "
                             "/usr/share/locale-langpack)")
    parser.add_argument("--language", type=locale_code, default=SPANISH,
                        help="the target language's locale code (default es: the corpus messages-en-es); another "
                             "builds English -> that language from its catalogs, a folder to train on with --data")
    args = parser.parse_args(argv)
    folder, meta, cached, elapsed = timed_build(
        args.out if args.out is not None else default_cache_dir(args.language),
        lambda folder: build_messages_corpus(folder, locale_dir=args.locale_dir, log=print, force=args.force,
                                             language=args.language))
    stats, set_aside = meta["stats"], meta["set_aside"]
    print_build(corpus_name(args.language), folder, meta, cached, elapsed, [
        f"read {len(meta['catalogs'])} catalogs ({stats['entries']} entries); set aside {len(set_aside)} lists of names "
        f"({sum(c['entries'] or 0 for c in set_aside.values())} entries)"
        + (f"; skipped {len(meta['skipped'])} damaged" if meta["skipped"] else ""),
        f"dropped {stats['plural']} plural, {stats['untranslated']} untranslated, {stats['no_letters']} without a "
        f"letter, {stats['identical']} the same in both languages, {stats['too_long']} over {MAX_WORDS} words, "
        f"{stats['length_ratio']} by the length rule (|d| > {MAX_DEVIATION}), {stats['duplicate']} repeated English "
        "messages"], target=language_name(args.language))
    return 0


if __name__ == "__main__":
    sys.exit(main())
