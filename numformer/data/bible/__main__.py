"""``python -m numformer.data.bible [--out DIR] [--force] [--sword-path DIR]``: build the bible-en-es
corpus (or find it in the cache) and print its counts."""

from __future__ import annotations

import sys
from pathlib import Path

from ...cli.front import command_line, parser as command_parser
from ..built_corpus import print_build, timed_build
from . import CORPUS_NAME, MAX_DEVIATION, build_bible_corpus, default_cache_dir


@command_line("python -m numformer.data.bible")
def main(argv=None) -> int:
    """``python -m numformer.data.bible [--out DIR] [--force]``: build and print counts (a DataError: one
    line, exit 2)."""
    parser = command_parser("python -m numformer.data.bible",
                            description="Build the bible-en-es corpus (English -> Spanish) from SWORD modules.")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"folder for the corpus files (default {default_cache_dir()})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a cached build exists")
    parser.add_argument("--sword-path", default=None, help="SWORD data folder holding both modules")
    args = parser.parse_args(argv)
    folder, meta, cached, elapsed = timed_build(
        args.out if args.out is not None else default_cache_dir(),
        lambda folder: build_bible_corpus(folder, force=args.force, sword_path=args.sword_path))
    stats = meta["stats"]
    print_build(CORPUS_NAME, folder, meta, cached, elapsed, [
        f"dropped {stats['dropped_empty']} pairs with an empty side and {stats['dropped_length']} by the length rule "
        f"(|d| > {MAX_DEVIATION}); re-aligned {stats['realigned_chapters']} chapters ({stats['moved_beads']} pairs "
        "moved off their reference)"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
