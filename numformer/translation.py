"""Text in, text out: batched translation of lines and sacreBLEU scoring.

Lines are encoded with the shared subword vocabulary, sorted by length and cut
into token-bounded batches (so a batch wastes little on padding), decoded with
beam or greedy search, then put back in input order and detokenised. An empty
(or whitespace-only) input line gives an empty output line without running the
model. Scores are sacreBLEU's BLEU and chrF on detokenised text with its
default 13a tokenisation, with the signature that makes them comparable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .decode import beam_search, greedy_search


@dataclass
class DecodeOptions:
    """Search settings (Section 6.1's defaults: beam 4, alpha 0.6, input length + 50)."""

    beam: int = 4
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    nbest: int = 1
    max_tokens: int = 4000   # source tokens per decoding batch (times beam for the decoder)


def source_batch(sentences, pad_id: int, eos_id: int):
    """Token-id sentences -> (B, S) int64 array: each sentence + EOS, right-padded (the encoder's input)."""
    width = max(len(s) for s in sentences) + 1
    src = np.full((len(sentences), width), pad_id, dtype=np.int64)
    for row, ids in enumerate(sentences):
        src[row, : len(ids) + 1] = list(ids) + [eos_id]
    return src


def _batches_by_length(lengths, max_tokens: int):
    """Index lists of sentences sorted by length, each list's (count x longest) under max_tokens."""
    order = np.argsort(lengths, kind="stable")
    batch, longest = [], 0
    for i in order:
        n = int(lengths[i])
        if batch and (len(batch) + 1) * max(longest, n) > max_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(int(i))
        longest = max(longest, n)
    if batch:
        yield batch


def translate_ids(model, src_ids: list, bos_id: int, eos_id: int, opts: DecodeOptions, progress=None):
    """Token-id sentences (without EOS) -> per sentence a list of ``nbest`` (ids, score), input order.

    The model must be in eval mode. ``progress``: optional callable(n_done_sentences).
    """
    pad = model.cfg.pad_id
    limit = model.cfg.max_len - opts.max_len_b - 1
    results = [None] * len(src_ids)
    lengths = np.array([min(len(s), limit) + 1 for s in src_ids])
    for idx in _batches_by_length(lengths, max(1, opts.max_tokens)):
        src = source_batch([src_ids[i][:limit] for i in idx], pad, eos_id)
        if opts.beam <= 1:
            hyps = [[h] for h in greedy_search(model, src, bos_id, eos_id, opts.max_len_a, opts.max_len_b)]
        else:
            hyps = beam_search(model, src, bos_id, eos_id, opts.beam, opts.alpha, opts.max_len_a, opts.max_len_b,
                               opts.nbest)
        for i, h in zip(idx, hyps):
            results[i] = [(x.tokens, x.score) for x in h]
        if progress is not None:
            progress(len(idx))
    return results


def translate_lines(model, vocab, lines: list, opts: DecodeOptions | None = None, progress=None):
    """Detokenised translations of ``lines`` (one per line, in order); with nbest > 1, lists of strings.

    Empty and whitespace-only lines translate to the empty string.
    """
    opts = opts or DecodeOptions()
    was_training = model.training
    model.eval()
    try:
        keep = [i for i, line in enumerate(lines) if line.strip()]
        encoded = vocab.encode([lines[i] for i in keep]) if keep else []
        found = translate_ids(model, encoded, vocab.bos_id, vocab.eos_id, opts, progress)
    finally:
        model.train(was_training)
    out = [[""] * opts.nbest if opts.nbest > 1 else "" for _ in lines]
    for i, hyps in zip(keep, found):
        texts = vocab.decode([ids for ids, _ in hyps])
        out[i] = texts + [""] * (opts.nbest - len(texts)) if opts.nbest > 1 else texts[0]
    return out


def score_translations(hypotheses: list, references: list) -> dict:
    """sacreBLEU BLEU and chrF of detokenised hypotheses against one reference each."""
    import sacrebleu  # noqa: PLC0415  (only needed when scoring)

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations but {len(references)} references: the counts must match")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b)}
