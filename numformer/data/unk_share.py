"""How much of a text a given vocabulary turns into ``<unk>``, said in one warning line when it is too much.

A model is fine-tuned (``train.py --init-from``) and used (``translate.py``) with the vocabulary it was
trained with. Text in a language or script that vocabulary never saw becomes ``<unk>`` wherever it lacks
a character (neither numformer's sentencepiece vocabularies nor Marian's have byte fallback), and nothing
says so: fine-tuning then teaches the model to write ``<unk>``, a translation of such input loses every
word it could not read, and the user finds out from a poor BLEU. :func:`warn_unk_share` measures the share
and says it, once, with the file and what to do.
"""
from __future__ import annotations

import numpy as np

#: The share of ``<unk>`` tokens above which a text is warned about. Why 2%: text in the languages a
#: vocabulary was trained on has next to none (sentencepiece gives every character of its training text a
#: piece: bible-en-es's own 8,000-piece vocabulary makes 0.0015% of its Spanish test split <unk>, a few
#: rare symbols), while text the vocabulary does not cover is far above it (the same Spanish test split with
#: a vocabulary trained on the English side alone: 7.0% <unk>, every accented letter; Greek and Russian
#: sentences with the en-es vocabulary: 44%). 2% is three orders of magnitude above the first and well
#: below the second: a text with the odd emoji or foreign name stays quiet, a language with letters the
#: vocabulary lacks does not.
UNK_WARNING_SHARE = 0.02
#: What to do about it when fine-tuning (train.py --init-from) and when translating.
TRAINING_ADVICE = ("train a vocabulary on this text (leave out --init-from) or fine-tune a model whose vocabulary "
                   "covers this language")
TRANSLATING_ADVICE = "use a model whose vocabulary covers this language (or train one on such text)"
#: Tokens compared at a time in a memory-mapped array (bounds the memory of counting a large corpus).
BLOCK = 1 << 24


def count_unk(ids, unk_id: int) -> tuple[int, int]:
    """(``<unk>`` tokens, all tokens) of encoded text: a flat array of ids (e.g. a prepared split's
    memory-mapped ids, read in blocks) or a list of id sequences (``vocab.encode`` 's result)."""
    if isinstance(ids, np.ndarray):
        flat = ids.reshape(-1)
        unk = sum(int(np.count_nonzero(flat[i:i + BLOCK] == unk_id)) for i in range(0, flat.size, BLOCK))
        return unk, int(flat.size)
    unk = total = 0
    for seq in ids:
        seq = np.asarray(seq)
        unk += int(np.count_nonzero(seq == unk_id))
        total += int(seq.size)
    return unk, total


def warn_unk_share(encoded: dict, unk_id: int, log, advice: str = TRAINING_ADVICE,
                   threshold: float = UNK_WARNING_SHARE) -> str | None:
    """Measure the ``<unk>`` share of each encoded text and, when one is above ``threshold``, call ``log``
    with ONE line: the share, the threshold, the file (the worst first, any other above it in the same
    line) and ``advice``. Returns that line, or None when every share is at or below ``threshold``.

    Args:
        encoded: {the file's name as the user knows it: its ids (see :func:`count_unk`)}.
        unk_id: the vocabulary's ``<unk>`` id.
        log: called with the warning line.
    """
    shares = []
    for name, ids in encoded.items():
        unk, total = count_unk(ids, unk_id)
        if total and unk / total > threshold:
            shares.append((unk / total, str(name)))
    if not shares:
        return None
    shares.sort(key=lambda s: -s[0])
    (worst, name), rest = shares[0], shares[1:]
    also = f" (and {', '.join(f'{share:.1%} of {n}' for share, n in rest)})" if rest else ""
    line = (f"warning: <unk> is {worst:.1%} of the tokens of {name}{also}, above the {threshold:.0%} this warns at: "
            f"the vocabulary does not cover this text; {advice}")
    log(line)
    return line
