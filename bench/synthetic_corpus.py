"""A synthetic parallel corpus of any size from a seed, for bench/data_scale.py (never committed).

Two made-up "languages", each a lexicon of 60,000 words of 1-14 random letters, used with Zipf's law
(word rank r drawn with probability ~ 1/r^1.1, as in natural text), so a subword vocabulary finds
frequent whole words and splits rare ones, as it does on real text. Sentence lengths follow a
log-normal of median 20 words (WMT14 En-De's training side: median about 20 words, a long tail past 100),
clipped to 1-200 words; the target's length is the source's times a factor around 1.1, as translations
run a little longer or shorter than their source. Sentences are not translations of each other: the
bench measures the data path (preparation, memory, first step), not what a model learns.

Written chunk by chunk with numpy (no Python loop over words), ~10 s per million pairs on one core.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

LEXICON = 60_000
ZIPF = 1.1


def _lexicon(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``size`` distinct-enough random lowercase words: (bytes of all words concatenated, offsets (size+1,))."""
    lengths = np.clip(rng.poisson(5.0, size) + 1, 1, 14)
    offsets = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    letters = rng.integers(ord("a"), ord("z") + 1, size=int(offsets[-1]), dtype=np.uint8)
    return letters, offsets


def _zipf_cdf(size: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** ZIPF
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def _sentences(rng, letters, offsets, cdf, n_words: np.ndarray) -> bytes:
    """Lines of ``n_words[i]`` words each (Zipf-drawn), space-separated, each ending in a newline."""
    total = int(n_words.sum())
    words = np.searchsorted(cdf, rng.random(total), side="right").clip(0, len(cdf) - 1)
    wlen = offsets[words + 1] - offsets[words]
    # Every word is followed by one separator byte: a space, or a newline after a sentence's last word.
    out_len = wlen + 1
    out_end = np.cumsum(out_len)
    out_start = out_end - out_len
    buf = np.empty(int(out_end[-1]) if total else 0, dtype=np.uint8)
    # Byte k of word w goes to out_start[w] + k and comes from letter offsets[words[w]] + k: one gather.
    k = np.arange(int(wlen.sum())) - np.repeat(np.cumsum(wlen) - wlen, wlen)
    buf[np.repeat(out_start, wlen) + k] = letters[np.repeat(offsets[words], wlen) + k]
    sep = out_end - 1
    buf[sep] = ord(" ")
    last_word = np.cumsum(n_words) - 1
    buf[sep[last_word]] = ord("\n")
    return buf.tobytes()


def write_corpus(folder, n_train: int, seed: int = 0, n_valid: int = 1000, n_test: int = 1000,
                 chunk: int = 200_000) -> Path:
    """Write ``train/valid/test .src/.tgt`` with ``n_train`` training pairs into ``folder``; returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    langs = [_lexicon(rng, LEXICON) for _ in range(2)]
    cdf = _zipf_cdf(LEXICON)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(folder / f"{split}.src", "wb") as fs, open(folder / f"{split}.tgt", "wb") as ft:
            for start in range(0, n, chunk):
                m = min(chunk, n - start)
                src_len = np.clip(np.rint(rng.lognormal(np.log(20.0), 0.6, m)), 1, 200).astype(np.int64)
                tgt_len = np.clip(np.rint(src_len * rng.normal(1.1, 0.15, m)), 1, 220).astype(np.int64)
                fs.write(_sentences(rng, *langs[0], cdf, src_len))
                ft.write(_sentences(rng, *langs[1], cdf, tgt_len))
    return folder
