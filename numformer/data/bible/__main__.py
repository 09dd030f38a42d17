"""``python -m numformer.data.bible [--out DIR] [--force] [--sword-path DIR]``: build the bible-en-es
corpus (or find it in the cache) and print its counts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...cli.front import command_line, parser as command_parser
from ..text_files import SPLITS
from . import CORPUS_NAME, MAX_DEVIATION, build_bible_corpus, cache_is_complete, default_cache_dir, load_meta


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
    folder = args.out if args.out is not None else default_cache_dir()
    cached = not args.force and cache_is_complete(folder)
    start = time.perf_counter()
    folder = build_bible_corpus(folder, force=args.force, sword_path=args.sword_path)
    elapsed = time.perf_counter() - start
    meta = load_meta(folder)
    counts, stats = meta["counts"], meta["stats"]
    print(f"{CORPUS_NAME} (English -> Spanish) in {folder}")
    for split in SPLITS:
        print(f"  {split:5s} {counts[split]:6d} pairs")
    print(f"  dropped {stats['dropped_empty']} pairs with an empty side and {stats['dropped_length']} by the "
          f"length rule (|d| > {MAX_DEVIATION}); re-aligned {stats['realigned_chapters']} chapters "
          f"({stats['moved_beads']} pairs moved off their reference)")
    if cached:
        print(f"  found in the cache in {elapsed:.2f} s (built in {meta['build_seconds']:.1f} s); --force rebuilds")
    else:
        print(f"  built in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
