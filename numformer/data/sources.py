"""What a run trains on, named as train.py and ``python -m numformer.prepare`` name it: a corpus the
project builds itself (``--corpus bible-en-es``), a folder of text files (``--data DIR``) or a
synthetic task (``--task copy|reverse``), exactly one of the three.
"""
from __future__ import annotations

from pathlib import Path

from .errors import DataError
from .synthetic import make_synthetic
from .text_files import check_corpus_dir

#: The corpora the project builds itself from installed packages.
CORPORA = ("bible-en-es",)
#: Train, valid and test pairs of a synthetic task.
TASK_PAIRS = (20000, 500, 500)


def resolve_source(corpus, data_dir, task) -> tuple[Path | None, str]:
    """Exactly one of corpus / data_dir / task -> (its text folder, or None for a task; the source
    string 'corpus:NAME', 'data:DIR' or 'task:NAME' that logs and checkpoints record).

    A named corpus is built (or found in its cache) here; a folder is checked to hold the six files.
    """
    given = [x for x in (corpus, data_dir, task) if x]
    if len(given) != 1:
        raise DataError("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if corpus:
        if corpus not in CORPORA:
            raise DataError(f"unknown corpus {corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
        from .bible import build_bible_corpus  # noqa: PLC0415  (the Bible's code only when that corpus is asked for)

        return build_bible_corpus(), f"corpus:{corpus}"
    if data_dir:
        return check_corpus_dir(data_dir), f"data:{Path(data_dir).resolve()}"
    if task not in ("copy", "reverse"):
        raise DataError(f"unknown task {task!r}: choose copy or reverse")
    return None, f"task:{task}"


def task_texts(task: str, seed: int) -> dict[str, tuple[list[str], list[str]]]:
    """The sentences of a synthetic task: ``{split: (src_lines, tgt_lines)}``, ``TASK_PAIRS`` of them."""
    return make_synthetic(task, *TASK_PAIRS, seed=seed)
