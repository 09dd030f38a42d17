"""Synthetic translation tasks for smoke tests and debugging: ``copy`` and
``reverse``.

Sentences are space-separated symbols (by default the letters ``a``-``z``),
so they go through the same path as real text: subword vocabulary,
encoding, token batching. A model that cannot learn ``copy`` in a few
hundred steps has a bug; ``reverse`` additionally needs attention to look
at the right source position.
"""

from __future__ import annotations

import string

import numpy as np

from .errors import DataError
from .text_files import SPLITS

#: Task name -> function from a source symbol list to the target symbol list.
TASKS = {
    "copy": lambda symbols: list(symbols),
    "reverse": lambda symbols: list(reversed(symbols)),
}

DEFAULT_VOCAB = tuple(string.ascii_lowercase)


def make_synthetic(task: str, n_train: int, n_valid: int, n_test: int, seed: int = 0,
                   vocab=DEFAULT_VOCAB, min_len: int = 3, max_len: int = 10) -> dict[str, tuple[list[str], list[str]]]:
    """Generate a synthetic parallel corpus.

    Each source sentence has a length drawn uniformly from
    ``[min_len, max_len]`` and symbols drawn uniformly from ``vocab``; the
    target is the task applied to it. All sentences (over all splits) are
    distinct, so valid and test measure generalisation, not memorisation.

    Args:
        task: ``"copy"`` or ``"reverse"``.
        n_train, n_valid, n_test: number of pairs per split.
        seed: the whole corpus is a function of (task, sizes, seed, vocab,
            lengths): same arguments, same corpus.
        vocab: the symbols, non-empty strings without whitespace.
        min_len, max_len: sentence length range in symbols, inclusive.
    Returns:
        ``{"train": (src_lines, tgt_lines), "valid": ..., "test": ...}``
        like :func:`numformer.data.load_parallel_dir`; lines are symbols
        joined by single spaces.
    Raises:
        DataError: unknown task, bad sizes or lengths, bad vocabulary, or
            more sentences asked for than distinct ones exist.
    """
    if task not in TASKS:
        raise DataError(f"unknown synthetic task {task!r}: choose one of {', '.join(sorted(TASKS))}")
    sizes = {"train": n_train, "valid": n_valid, "test": n_test}
    for split, n in sizes.items():
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise DataError(f"n_{split} must be a non-negative integer, got {n!r}")
    if n_train < 1:
        raise DataError("n_train must be at least 1: the training split needs at least one sentence pair")
    if not (isinstance(min_len, (int, np.integer)) and isinstance(max_len, (int, np.integer))) \
            or min_len < 1 or max_len < min_len:
        raise DataError(f"need 1 <= min_len <= max_len, got min_len={min_len!r}, max_len={max_len!r}")
    vocab = tuple(vocab)
    if not vocab:
        raise DataError("the synthetic vocabulary is empty: give at least one symbol")
    for symbol in vocab:
        if not isinstance(symbol, str) or not symbol or symbol != "".join(symbol.split()):
            raise DataError(f"synthetic vocabulary symbol {symbol!r} is empty or contains whitespace: "
                            "symbols are joined by spaces, so they must be non-empty and space-free")
    if len(set(vocab)) != len(vocab):
        raise DataError("the synthetic vocabulary has repeated symbols: give each symbol once")
    total = n_train + n_valid + n_test
    possible = sum(len(vocab) ** length for length in range(min_len, max_len + 1))
    # Rejection sampling of distinct sentences slows down sharply near the
    # limit; half the space is plenty for any sensible request.
    if total > possible // 2 + (1 if possible == 1 else 0):
        raise DataError(
            f"asked for {total} distinct sentences but only {possible} exist with {len(vocab)} symbols and "
            f"lengths {min_len}-{max_len} (at most half of them can be drawn): use a larger vocabulary or max_len"
        )

    rng = np.random.default_rng(seed)
    seen = set()
    out = {}
    apply = TASKS[task]
    for split in SPLITS:
        src_lines, tgt_lines = [], []
        while len(src_lines) < sizes[split]:
            length = int(rng.integers(min_len, max_len + 1))
            symbols = tuple(vocab[k] for k in rng.integers(0, len(vocab), size=length))
            if symbols in seen:
                continue
            seen.add(symbols)
            src_lines.append(" ".join(symbols))
            tgt_lines.append(" ".join(apply(symbols)))
        out[split] = (src_lines, tgt_lines)
    return out
