"""The length penalty chosen on the validation split, in bounded time, and kept with the run.

Section 6.1's alpha = 0.6 was chosen "after experimentation on the development set" for the paper's data
and models. A small model trained for minutes on other data ends its hypotheses earlier (its end-of-sentence
probability is higher where the reference goes on): its best alpha is another one, and the way to find it
is the paper's own: try it on held-out text. :func:`choose_alpha` decodes a subset of the validation split
once, with beam k and all k finished hypotheses kept, and re-ranks them for every alpha of :data:`ALPHAS`:
in :func:`~numformer.decoding.search.beam_search` alpha only ranks the finished hypotheses (which ones finish
does not depend on it), so one decoding gives exactly what a beam search with each alpha would return. The
alpha of the best sacreBLEU wins (a tie: the one nearest the paper's 0.6).

The choice is written to the run folder (``decoding.json``, :data:`~numformer.run_file_names.DECODING`) with
the validation BLEU, brevity penalty and length ratio of every alpha tried; ``train.py`` uses it for the test
translation and ``translate.py`` for a model of that run, unless ``--alpha`` says otherwise.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import run_file_names
from ..data.text_files import normalize_line
from ..files import atomic_write_text
from .search import PAPER_ALPHA, PAPER_BEAM, length_penalty
from .translation import DecodeOptions, clean_output, max_source_tokens, translate_ids

#: The paper's 0.6 among them. Up to 3: on messages-en-es's short sentences a 10-minute model's validation BLEU
#: still rose at 2.0 (30.41, brevity penalty 0.957; docs/results.md, "A recipe for the budget").
ALPHAS = (0.0, 0.3, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0)
CHUNK = 32            # sentences decoded between two looks at the clock
MAX_SENTENCES = 500   # enough for BLEU to separate alphas; more only costs time


@dataclass
class DecodingChoice:
    """The alpha chosen on ``sentences`` validation sentences (beam ``beam``), with every alpha's figures."""

    alpha: float
    beam: int
    sentences: int
    seconds: float
    by_alpha: dict = field(default_factory=dict)   # str(alpha) -> {"bleu", "bp", "length_ratio"}

    def best(self) -> dict:
        """The chosen alpha's validation figures: ``{"bleu", "bp", "length_ratio"}``."""
        return self.by_alpha[_key(self.alpha)]

    def line(self) -> str:
        """One line for a log: the choice against the paper's alpha."""
        best, paper = self.best(), self.by_alpha.get(_key(PAPER_ALPHA))
        against = f" (the paper's {PAPER_ALPHA}: {paper['bleu']:.2f}, BP {paper['bp']:.3f})" if paper else ""
        return (f"alpha {self.alpha:g} chosen on {self.sentences} validation sentences in {self.seconds:.0f} s: "
                f"BLEU {best['bleu']:.2f}, BP {best['bp']:.3f}{against}")


def _key(alpha: float) -> str:
    return f"{alpha:g}"


def choose_alpha(model, vocab, src: list, ref: list, seconds: float, beam: int = PAPER_BEAM,
                 alphas=ALPHAS) -> DecodingChoice | None:
    """Decode validation sentences (``src``, ``ref``: lines) for about ``seconds`` (at least :data:`CHUNK`
    of them, at most :data:`MAX_SENTENCES`), then pick the alpha of the best BLEU; None when no sentence
    fits (empty lines, or longer than the positional table allows)."""
    limit = max_source_tokens(model)
    pairs = [(s, r) for s, r in zip(map(normalize_line, src), ref) if s]
    ids = vocab.encode_source([s for s, _ in pairs]) if pairs else []
    usable = [(i, r) for i, (one, (_, r)) in enumerate(zip(ids, pairs)) if len(one) <= limit][:MAX_SENTENCES]
    if not usable:
        return None
    found, refs, start = [], [], time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for at in range(0, len(usable), CHUNK):
            chunk = usable[at: at + CHUNK]
            found += finished_hypotheses(model, vocab, [ids[i] for i, _ in chunk], beam)
            refs += [r for _, r in chunk]
            if time.perf_counter() - start >= seconds:
                break
    finally:
        model.train(was_training)
    by_alpha = {_key(alpha): bleu_figures(texts_under(vocab, found, alpha), refs) for alpha in alphas}
    return DecodingChoice(pick(by_alpha, alphas), beam, len(found), round(time.perf_counter() - start, 1), by_alpha)


def pick(by_alpha: dict, alphas) -> float:
    """The alpha of the best BLEU; of equal ones, the nearest to the paper's 0.6 (a tie says nothing against it)."""
    return max(alphas, key=lambda a: (by_alpha[_key(a)]["bleu"], -abs(a - PAPER_ALPHA)))


def finished_hypotheses(model, vocab, src_ids: list, beam: int) -> list:
    """Per sentence, the (tokens, log-probability) of every hypothesis a beam search of size ``beam`` finishes
    (``nbest`` = beam, alpha 0: a hypothesis' score is its log-probability); the model in eval mode."""
    return translate_ids(model, src_ids, vocab.bos_id, vocab.eos_id, DecodeOptions(beam=beam, alpha=0.0, nbest=beam))


def texts_under(vocab, found: list, alpha: float) -> list:
    """The detokenised translations a beam search with ``alpha`` returns, from :func:`finished_hypotheses`."""
    return [clean_output(t) for t in vocab.decode(best_under(found, alpha))]


def bleu_figures(texts: list, refs: list) -> dict:
    """{"bleu", "bp", "length_ratio"} of translations against one reference each (sacreBLEU)."""
    import sacrebleu  # noqa: PLC0415  (only needed when scoring)

    bleu = sacrebleu.corpus_bleu(texts, [refs])
    return {"bleu": round(bleu.score, 2), "bp": round(bleu.bp, 4),
            "length_ratio": round(bleu.sys_len / max(bleu.ref_len, 1), 4)}


def best_under(found: list, alpha: float) -> list:
    """Each sentence's best finished hypothesis under ``alpha`` (its tokens): ``found`` holds per sentence the
    (tokens, log-probability) of every hypothesis a beam search finished (``nbest`` = beam, alpha 0), ranked
    here by ``log p / ((5 + |Y|) / 6) ** alpha``, |Y| counting the EOS; what beam search with that alpha
    returns first."""
    return [max(hyps, key=lambda h: h[1] / length_penalty(len(h[0]) + 1, alpha))[0] if hyps else []
            for hyps in found]


def write_choice(run_dir, choice: DecodingChoice) -> Path:
    return atomic_write_text(Path(run_dir) / run_file_names.DECODING, json.dumps(asdict(choice), indent=1) + "\n")


def read_choice(run_dir) -> DecodingChoice | None:
    """The run's choice, or None when it has none (an older run, a run too short to choose, a model file
    outside a run folder). A file that does not read as one is None too: the paper's alpha is then used,
    which is what a run without the file gets."""
    path = Path(run_dir) / run_file_names.DECODING
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return DecodingChoice(float(data["alpha"]), int(data["beam"]), int(data["sentences"]),
                              float(data["seconds"]), dict(data.get("by_alpha", {})))
    except (OSError, ValueError, KeyError, TypeError):
        return None
