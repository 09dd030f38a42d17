"""The sentences the shared vocabulary is trained on (Section 5.1: one source-target vocabulary).

At most ``vocab_sample`` sentences, both sides together (2,000,000 by default; sentencepiece's
authors recommend a few million): a training split that fits is used whole, every line in file
order, source then target; a larger one gives the two sides of ``vocab_sample // 2`` pairs drawn at
random from the seed, so the vocabulary sees whole pairs. The training files are streamed in blocks
(:func:`numformer.data.text_files.iter_line_blocks`), which also checks every line to be UTF-8.
"""
from __future__ import annotations

import numpy as np

from .text_files import SIDES, iter_line_blocks, normalize_line

#: Sentences (both sides together) the vocabulary is trained on, at most.
DEFAULT_VOCAB_SAMPLE = 2_000_000


def sample_training_text(folder, texts, n: int, vocab_sample: int, seed: int) -> tuple[list[str], bool]:
    """The vocabulary's training sentences and whether any training pair has both sides non-empty.

    Args:
        folder: the corpus folder (``train.src``, ``train.tgt``), or None for sentences in memory.
        texts: ``{split: (src_lines, tgt_lines)}`` when ``folder`` is None (a synthetic task: used whole).
        n: the training pairs (lines of each training file).
        vocab_sample: sentences (both sides) at most.
        seed: draws the pairs when the text does not fit.
    """
    if folder is None:
        src, tgt = texts["train"]
        return src + tgt, any(s and t for s, t in zip(src, tgt))
    whole = 2 * n <= vocab_sample
    picked = None if whole else np.sort(np.random.default_rng([seed, 1]).choice(n, vocab_sample // 2, replace=False))
    sides, nonempty = [], []
    for side in SIDES:
        lines_out, flags = [], np.zeros(n, dtype=bool)
        for done, lines in iter_line_blocks(folder / f"train.{side}", normalize=False):
            flags[done:done + len(lines)] = np.fromiter(map(bool, map(str.strip, lines)), dtype=bool,
                                                        count=len(lines))
            if whole:
                lines_out.extend(map(normalize_line, lines))
            else:
                lo, hi = np.searchsorted(picked, [done, done + len(lines)])
                lines_out.extend(normalize_line(lines[i - done]) for i in picked[lo:hi])
        sides.append(lines_out)
        nonempty.append(flags)
    return sides[0] + sides[1], bool((nonempty[0] & nonempty[1]).any())
