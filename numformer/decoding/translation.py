"""Text in, text out: batched translation of lines and sacreBLEU scoring.

Lines are encoded with the vocabulary's source side (``encode_source``: numformer's shared subword
model, or a Marian model's ``source.spm``), sorted by length and cut
into token-bounded batches (so a batch wastes little on padding), decoded with
beam or greedy search, then put back in input order and detokenised. An empty
(or whitespace-only) input line gives an empty output line without running the
model. Scores are sacreBLEU's BLEU and chrF on detokenised text with its
default 13a tokenisation, with the signature that makes them comparable.

The contract: one output string per input line, in input order, and an output
never contains a line break or a tab (outputs pass through the same whitespace
normalisation as inputs, so even a vocabulary with byte pieces such as
``<0x0A>`` cannot break the line structure).

Long lines: the positional table (``ModelConfig.max_len``, 1024 in every preset)
bounds both the source and the output. A line of up to ``max_len - 1`` subword
tokens is translated as one sentence (nothing is cut); its output is at most
``min(a * (n + 1) + b, max_len)`` tokens. A longer line is split into pieces of
at most ``max_len - 1`` tokens, at word boundaries where a word start is
available (mid-word only for a single word longer than the table), the pieces
are translated separately and their outputs concatenated in order (as token
sequences, so the detokeniser places the spaces).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data.batching import pad_rows
from ..data.text_files import normalize_line
from .search import PAPER_ALPHA, PAPER_BEAM, PAPER_MAX_LEN_A, PAPER_MAX_LEN_B, beam_search, greedy_search


@dataclass
class DecodeOptions:
    """Search settings (Section 6.1's defaults: beam 4, alpha 0.6, input length + 50)."""

    beam: int = PAPER_BEAM
    alpha: float = PAPER_ALPHA
    max_len_a: float = PAPER_MAX_LEN_A
    max_len_b: int = PAPER_MAX_LEN_B
    nbest: int = 1
    max_tokens: int = 4000   # source tokens per decoding batch (times beam for the decoder)


def source_batch(sentences, pad_id: int, eos_id: int):
    """Token-id sentences -> (B, S) int64 array: each sentence + EOS, right-padded (the encoder's input)."""
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    flat = np.concatenate([np.asarray(s, dtype=np.int64).reshape(-1) for s in sentences])
    return pad_rows(flat, lengths, pad_id, suffix=eos_id)


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


def max_source_tokens(model) -> int:
    """The longest source (in subword tokens, without EOS) the encoder's positional table holds."""
    return max(1, model.cfg.max_len - 1)


def split_long(ids, limit: int, word_start=None) -> list:
    """Cut a token-id sentence into pieces of at most ``limit`` tokens (one piece when it fits).

    With ``word_start`` (a boolean per vocabulary id: does the piece begin a word?), each cut is
    made before the last word start that keeps the piece within ``limit``; a piece with no word
    start inside it (one very long word) is cut at ``limit``.
    """
    ids = list(ids)
    if len(ids) <= limit:
        return [ids]
    pieces, start = [], 0
    while len(ids) - start > limit:
        cut = start + limit
        if word_start is not None:
            for j in range(start + limit, start, -1):  # the piece may end right before a word start
                if word_start[ids[j]]:
                    cut = j
                    break
        pieces.append(ids[start:cut])
        start = cut
    pieces.append(ids[start:])
    return pieces


def translate_ids(model, src_ids: list, bos_id: int, eos_id: int, opts: DecodeOptions, progress=None,
                  word_start=None):
    """Token-id sentences (without EOS) -> per sentence a list of ``nbest`` (ids, score), input order.

    The model must be in eval mode. ``progress``: optional callable(n_done) (sentences, or pieces of long ones).
    A sentence longer than the positional table allows (:func:`max_source_tokens`) is split with
    :func:`split_long` (``word_start`` picks the cuts), its pieces are searched separately and the
    results concatenated: the i-th candidate of the sentence joins the i-th candidates of its pieces
    (the best one where a piece has fewer), scored by the sum of the pieces' scores.
    """
    pad = model.cfg.pad_id
    limit = max_source_tokens(model)
    pieces, owner = [], []
    for i, ids in enumerate(src_ids):
        for piece in split_long(ids, limit, word_start):
            pieces.append(piece)
            owner.append(i)
    found = [None] * len(pieces)
    lengths = np.array([len(p) + 1 for p in pieces], dtype=np.int64)
    for idx in _batches_by_length(lengths, max(1, opts.max_tokens)):
        src = source_batch([pieces[i] for i in idx], pad, eos_id)
        if opts.beam <= 1:
            hyps = [[h] for h in greedy_search(model, src, bos_id, eos_id, opts.max_len_a, opts.max_len_b)]
        else:
            hyps = beam_search(model, src, bos_id, eos_id, opts.beam, opts.alpha, opts.max_len_a, opts.max_len_b,
                               opts.nbest)
        for i, h in zip(idx, hyps):
            found[i] = [(x.tokens, x.score) for x in h]
        if progress is not None:
            progress(len(idx))
    results = [[] for _ in src_ids]
    parts = [[] for _ in src_ids]
    for i, hyps in zip(owner, found):
        parts[i].append(hyps)
    for i, piece_hyps in enumerate(parts):
        if len(piece_hyps) == 1:
            results[i] = piece_hyps[0]
            continue
        n = max(len(h) for h in piece_hyps)
        for rank in range(n):
            chosen = [h[min(rank, len(h) - 1)] if h else ([], 0.0) for h in piece_hyps]
            results[i].append(([t for ids, _ in chosen for t in ids], float(sum(sc for _, sc in chosen))))
    return results


def _word_starts(vocab) -> np.ndarray:
    """Per vocabulary id: does its piece start a word (sentencepiece's U+2581 prefix)?"""
    return np.array([vocab.id_to_piece(i).startswith("\u2581") for i in range(vocab.size)], dtype=bool)


def clean_output(text: str) -> str:
    """An output line as safe as an input line: no line breaks, tabs or runs of whitespace."""
    return normalize_line(text)


def translate_lines(model, vocab, lines: list, opts: DecodeOptions | None = None, progress=None):
    """Detokenised translations of ``lines`` (one per line, in order); with nbest > 1, lists of strings.

    Empty and whitespace-only lines translate to the empty string. Lines are normalised like the
    corpus readers do; outputs never contain a line break or a tab; long lines are split (see the
    module docstring).
    """
    opts = opts or DecodeOptions()
    lines = [normalize_line(line) for line in lines]
    was_training = model.training
    model.eval()
    try:
        keep = [i for i, line in enumerate(lines) if line]
        encoded = vocab.encode_source([lines[i] for i in keep]) if keep else []
        limit = max_source_tokens(model)
        word_start = _word_starts(vocab) if any(len(ids) > limit for ids in encoded) else None
        found = translate_ids(model, encoded, vocab.bos_id, vocab.eos_id, opts, progress, word_start)
    finally:
        model.train(was_training)
    out = [[""] * opts.nbest if opts.nbest > 1 else "" for _ in lines]
    for i, hyps in zip(keep, found):
        texts = [clean_output(t) for t in vocab.decode([ids for ids, _ in hyps])] if hyps else [""]
        out[i] = texts + [""] * (opts.nbest - len(texts)) if opts.nbest > 1 else texts[0]
    return out


def score_translations(hypotheses: list, references: list) -> dict:
    """sacreBLEU BLEU and chrF of detokenised hypotheses against one reference each, with BLEU's brevity penalty
    and length ratio (hypothesis / reference tokens: below 1 the translations are short)."""
    import sacrebleu  # noqa: PLC0415  (only needed when scoring)

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations but {len(references)} references: the counts must match")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()), "bleu_detail": str(b),
            "brevity_penalty": round(b.bp, 4), "length_ratio": round(b.sys_len / max(b.ref_len, 1), 4)}
