"""What a run trains on, named as train.py and ``python -m numformer.prepare`` name it: a corpus the
project builds itself (``--corpus bible-en-es``, ``--corpus messages-en-es``), a folder of text files
(``--data DIR``) or a synthetic task (``--task copy|reverse``), exactly one of the three. The WMT 2014 corpora
(:mod:`numformer.data.wmt14`) also take ``--wmt-dir``, the user's own copy of their files.
"""
from __future__ import annotations

from pathlib import Path

from .errors import DataError
from .synthetic import make_synthetic
from .text_files import check_corpus_dir

#: The corpora the project builds itself: from installed packages (bible-en-es from the SWORD Bible modules,
#: messages-en-es from the gettext message catalogs) or, for the paper's WMT 2014 pairs, through the datasets
#: library or from the user's files (--wmt-dir).
CORPORA = ("bible-en-es", "messages-en-es", "wmt14-en-de", "wmt14-en-fr")
#: The corpora whose files --wmt-dir gives.
WMT_CORPORA = ("wmt14-en-de", "wmt14-en-fr")
#: Train, valid and test pairs of a synthetic task.
TASK_PAIRS = (20000, 500, 500)


def resolve_source(corpus, data_dir, task, wmt_dir=None, log=None) -> tuple[Path | None, str]:
    """Exactly one of corpus / data_dir / task -> (its text folder, or None for a task; the source
    string 'corpus:NAME', 'data:DIR' or 'task:NAME' that logs and checkpoints record).

    A named corpus is built (or found in its cache) here, a WMT one from ``wmt_dir`` when given
    (``log`` hears its filter counts, and for every corpus which source changed when a cached build is
    built again); a folder is checked to hold the six files.
    """
    if wmt_dir is not None and corpus not in WMT_CORPORA:
        raise DataError(f"--wmt-dir gives the files of a WMT 2014 corpus: use it with --corpus "
                        f"{' or --corpus '.join(WMT_CORPORA)}")
    given = [x for x in (corpus, data_dir, task) if x]
    if len(given) != 1:
        raise DataError("give exactly one of --corpus NAME, --data DIR or --task copy|reverse")
    if corpus:
        if corpus not in CORPORA:
            raise DataError(f"unknown corpus {corpus!r}: choose one of {', '.join(CORPORA)}, or pass --data DIR")
        if corpus in WMT_CORPORA:
            from .wmt14 import build_wmt_corpus  # noqa: PLC0415

            return build_wmt_corpus(corpus, wmt_dir, log=log), f"corpus:{corpus}"
        if corpus == "messages-en-es":
            from .messages import build_messages_corpus  # noqa: PLC0415  (the catalogs' code only when asked for)

            return build_messages_corpus(log=log), f"corpus:{corpus}"
        from .bible import build_bible_corpus  # noqa: PLC0415  (the Bible's code only when that corpus is asked for)

        return build_bible_corpus(log=log), f"corpus:{corpus}"
    if data_dir:
        return check_corpus_dir(data_dir), f"data:{Path(data_dir).resolve()}"
    if task not in ("copy", "reverse"):
        raise DataError(f"unknown task {task!r}: choose copy or reverse")
    return None, f"task:{task}"


def paper_vocab_size(corpus) -> int | None:
    """The vocabulary size the paper used for ``corpus`` (Section 5.1: 37,000 En-De, 32,000 En-Fr), None
    for the others (their default follows the corpus size: :func:`numformer.data.vocab.default_vocab_size`)."""
    if corpus not in WMT_CORPORA:
        return None
    from .wmt14 import WMT14  # noqa: PLC0415

    return WMT14[corpus].vocab_size


def task_texts(task: str, seed: int) -> dict[str, tuple[list[str], list[str]]]:
    """The sentences of a synthetic task: ``{split: (src_lines, tgt_lines)}``, ``TASK_PAIRS`` of them."""
    return make_synthetic(task, *TASK_PAIRS, seed=seed)
