"""From a corpus name, a folder or a synthetic task to encoded splits and a shared vocabulary.

The vocabulary (Section 5.1: one shared source-target subword vocabulary) is
trained once over both sides of the training data and stored in the run folder
as ``spm.model``, so a resumed run and translate.py use exactly the same one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .data import DataError, SubwordVocab, default_vocab_size, load_parallel_dir, make_synthetic

CORPORA = ("bible-en-es",)
VOCAB_FILE = "spm.model"


@dataclass
class PreparedData:
    vocab: SubwordVocab
    text: dict            # split -> (src_lines, tgt_lines)
    ids: dict             # split -> (src_ids, tgt_ids)
    source: str           # what was asked for, for the logs and the checkpoint


def load_text(corpus: str | None = None, data_dir: str | None = None, task: str | None = None,
              seed: int = 0) -> tuple[dict, str]:
    """Exactly one of corpus / data_dir / task -> (split -> (src_lines, tgt_lines), description)."""
    given = [x for x in (corpus, data_dir, task) if x]
    if len(given) != 1:
        raise DataError("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if corpus:
        if corpus not in CORPORA:
            raise DataError(f"unknown corpus {corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
        from .data.bible import build_bible_corpus  # noqa: PLC0415  (pysword only when asked for)

        return load_parallel_dir(build_bible_corpus()), f"corpus:{corpus}"
    if data_dir:
        return load_parallel_dir(data_dir), f"data:{Path(data_dir).resolve()}"
    if task not in ("copy", "reverse"):
        raise DataError(f"unknown task {task!r}: choose copy or reverse")
    return make_synthetic(task, 20000, 500, 500, seed=seed), f"task:{task}"


def prepare(out_dir, corpus=None, data_dir=None, task=None, vocab_size=None, seed: int = 0) -> PreparedData:
    """Load the text, train (or reuse) ``out_dir/spm.model``, and encode every split."""
    text, source = load_text(corpus, data_dir, task, seed)
    src, tgt = text["train"]
    if not any(s and t for s, t in zip(src, tgt)):
        raise DataError(f"the training data ({source}) has no pair with both sides non-empty: "
                        "fill train.src and train.tgt with sentence pairs")
    out_dir = Path(out_dir)
    vocab_path = out_dir / VOCAB_FILE
    if vocab_path.exists():
        vocab = SubwordVocab.load(vocab_path)
    else:
        src, tgt = text["train"]
        size = vocab_size or default_vocab_size(len(src))
        vocab = SubwordVocab.train(src + tgt, out_dir / "spm", size, seed=seed)
    ids = {split: (vocab.encode(s), vocab.encode(t)) for split, (s, t) in text.items()}
    return PreparedData(vocab, text, ids, source)
