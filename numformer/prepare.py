"""Prepare a corpus once: the shared vocabulary and a memory-mapped binary dataset; reuse it after.

``python -m numformer.prepare --data DIR --out RUN`` (or ``--corpus NAME``, ``--task copy``) does what
``train.py`` does on its first run into ``RUN``, under the run folder's lock: this file is the command
line; what preparing means (the vocabulary's sample, the encoding, the manifest and when it is
prepared again) is :mod:`numformer.data.prepared_dataset`, whose names are importable from here too.
"""
from __future__ import annotations

import sys

from .cli.front import command_line
from .data.prepared_dataset import prepare
from .data.sources import CORPORA
from .data.vocab_sample import DEFAULT_VOCAB_SAMPLE
from .training.config import TrainConfig


# -- the command --------------------------------------------------------------------------------------------
@command_line("python -m numformer.prepare")
def main(argv=None) -> int:
    """``python -m numformer.prepare``: prepare a corpus into a run folder; train.py --out that folder reuses it."""
    from .cli.arguments import OneLineParser, positive_int, seed_int  # noqa: PLC0415

    ap = OneLineParser(prog="python -m numformer.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", help=f"a corpus the project builds itself: {', '.join(CORPORA)}")
    ap.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    ap.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    ap.add_argument("--wmt-dir", metavar="DIR", help="with --corpus wmt14-en-de or wmt14-en-fr: your WMT 2014 files "
                                                    "(see numformer/data/wmt14.py)")
    ap.add_argument("--out", required=True, help="the run folder train.py will use (--out)")
    ap.add_argument("--vocab-size", type=positive_int, help="shared subword vocabulary size (default: from corpus size)")
    ap.add_argument("--vocab-sample", type=positive_int, default=DEFAULT_VOCAB_SAMPLE,
                    help=f"sentences the vocabulary is trained on, at most (default {DEFAULT_VOCAB_SAMPLE:,})")
    seed = TrainConfig().seed
    ap.add_argument("--seed", type=seed_int, default=seed, help=f"the run's --seed (default {seed}, train.py's)")
    ap.add_argument("--threads", type=positive_int, help="sentencepiece threads (default: every core)")
    args = ap.parse_args(argv)
    from .training.run_lock import lock_run_folder, refusal_leaves_folder_as_found  # noqa: PLC0415

    with refusal_leaves_folder_as_found(args.out):  # refused: the folder as it was found
        lock = lock_run_folder(args.out)  # the run folder is this process's while it prepares (train.py's lock)
        data = prepare(args.out, args.corpus, args.data, args.task, args.vocab_size, args.seed,
                       args.vocab_sample, args.threads, log=print, wmt_dir=args.wmt_dir)
    n = len(data.ids["train"])
    print(f"{'already prepared' if data.reused else 'prepared'}: {data.source}: {n:,} training pairs, "
          f"vocabulary {data.vocab.size} in {data.folder} ({data.seconds:.1f} s)")
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
