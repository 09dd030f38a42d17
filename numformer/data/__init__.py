"""Data for numformer: corpora, the shared subword vocabulary, token batching.

Typical use::

    from numformer.data import (build_bible_corpus, load_parallel_dir,
                                SubwordVocab, default_vocab_size, make_batches)

    splits = load_parallel_dir(build_bible_corpus())     # or a user folder
    src, tgt = splits["train"]
    vocab = SubwordVocab.train(src + tgt, "run/spm", default_vocab_size(len(src)))
    batches = make_batches(vocab.encode(src), vocab.encode(tgt), max_tokens=2500,
                           pad_id=vocab.pad_id, bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                           shuffle_seed=1, epoch=0, max_len=256)

Every user-facing problem raises :class:`DataError` (a ValueError) with a
one-line message saying what is wrong and what to do.
"""

from .batching import Batch, BatchList, BatchPlan, filter_long_pairs, make_batches, pad_sequences, plan_batches
from .binary import TokenPairs
from .errors import DataError
from .parallel import CORPUS_FILES, SPLITS, load_parallel_dir, normalize_line, read_lines, write_parallel_dir
from .synthetic import TASKS as SYNTHETIC_TASKS
from .synthetic import make_synthetic
from .vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordVocab, default_vocab_size

__all__ = [
    "Batch", "BatchList", "BatchPlan", "filter_long_pairs", "make_batches", "pad_sequences", "plan_batches",
    "TokenPairs",
    "DataError",
    "CORPUS_FILES", "SPLITS", "load_parallel_dir", "normalize_line", "read_lines", "write_parallel_dir",
    "SYNTHETIC_TASKS", "make_synthetic",
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SubwordVocab", "default_vocab_size",
    "build_bible_corpus", "default_bible_dir",
]


def __getattr__(name):
    # The bible builder is imported on first use only: importing it here
    # would make `python -m numformer.data.bible` warn that the module was
    # already imported by its package, and keeps pysword out of every import.
    if name == "build_bible_corpus":
        from .bible import build_bible_corpus
        return build_bible_corpus
    if name == "default_bible_dir":
        from .bible import default_cache_dir
        return default_cache_dir
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
