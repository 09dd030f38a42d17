"""Data for numformer: corpora, the shared subword vocabulary, token batching.

Typical use (what ``numformer.prepare`` and the trainer do)::

    from numformer.data import SubwordVocab, TokenPairs, load_parallel_dir, plan_batches

    src, tgt = load_parallel_dir("my_corpus/")["train"]           # or build_bible_corpus()
    vocab = SubwordVocab.train(src + tgt, "run/spm")               # shared subword vocabulary
    pairs = TokenPairs.from_lists(vocab.encode(src), vocab.encode(tgt))
    plan = plan_batches(*pairs.lengths, max_tokens=2500, shuffle_seed=1, epoch=0, max_len=256)
    batch = pairs.batch(plan[0], vocab.pad_id, vocab.bos_id, vocab.eos_id)   # src, tgt_in, tgt_out

Every user-facing problem raises :class:`DataError` (a ValueError) with a
one-line message saying what is wrong and what to do.
"""

from .batching import Batch, BatchPlan, pad_rows, plan_batches
from .binary import TokenPairs
from .errors import DataError
from .text_files import CORPUS_FILES, SPLITS, load_parallel_dir, normalize_line, read_lines, write_parallel_dir
from .synthetic import TASKS as SYNTHETIC_TASKS
from .synthetic import make_synthetic
from .vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordVocab, default_vocab_size

__all__ = [
    "Batch", "BatchPlan", "pad_rows", "plan_batches",
    "TokenPairs",
    "DataError",
    "CORPUS_FILES", "SPLITS", "load_parallel_dir", "normalize_line", "read_lines", "write_parallel_dir",
    "SYNTHETIC_TASKS", "make_synthetic",
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SubwordVocab", "default_vocab_size",
    "build_bible_corpus", "default_bible_dir",
]


def __getattr__(name):
    # The bible package is imported on first use only: most runs never build
    # that corpus, and `import numformer.data` stays free of its modules
    # (SWORD reading, OSIS cleaning, verse pairing).
    if name == "build_bible_corpus":
        from .bible import build_bible_corpus
        return build_bible_corpus
    if name == "default_bible_dir":
        from .bible import default_cache_dir
        return default_cache_dir
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
