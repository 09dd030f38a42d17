"""Greedy and beam search over the incremental (cached) decoder (Section 6.1).

The paper decodes with beam size 4, length penalty alpha = 0.6 (GNMT's
``lp(Y) = ((5 + |Y|) / 6) ** alpha``, Wu et al. 2016) and at most input length
+ 50 output tokens. Both searches run a whole batch of sentences at once: the
encoder runs once, then each step feeds one new token per hypothesis through
:meth:`Transformer.decode_step`, whose key/value cache (a
:class:`~numformer.layers.kv_cache.DecoderCache`, one per search) makes a step
cost one position rather than a re-run of the prefix.

Hypothesis length |Y| counts the output tokens including the final EOS. At the
output length limit EOS is forced, with the model's own EOS log-probability
(fairseq's rule): scoring it 0 would favour hypotheses cut off by the limit.
Sentences whose search is over are dropped from the batch (and their rows from
the cache), so long sentences do not keep short ones computing. The k beams of a
sentence share its one encoder output (``model.new_decoder_caches(beam=k)``). The per-step
arithmetic over the (rows, vocab) scores is :func:`greedy_pick` and :func:`beam_candidates`
below, as the math; their fast versions (fewer passes, no new (rows, vocab) arrays) are in
:mod:`numformer.kernels.decoding`.

Shapes: src (B, S) ids, right-padded with the model's pad id. Results are lists,
one per sentence, of token-id lists without BOS and EOS.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backend import get_array_module, to_host
from ..kernels import kernel


# Section 6.1's search settings: the one place they are written (DecodeOptions, train.py and
# translate.py take their defaults from here)
PAPER_BEAM = 4
PAPER_ALPHA = 0.6
PAPER_MAX_LEN_A, PAPER_MAX_LEN_B = 1.0, 50   # at most a * input length + b output tokens


def length_penalty(length, alpha: float):
    """GNMT length penalty ``((5 + length) / 6) ** alpha`` (works on scalars and arrays)."""
    return ((5.0 + length) / 6.0) ** alpha


def log_softmax(logits):
    """Row-wise log-softmax of (N, V) logits."""
    xp = get_array_module(logits)
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=-1, keepdims=True))


def ban_special(logp, pad_id: int, bos_id: int):
    """Padding and BOS are never generated: their log-probability becomes -inf (in place)."""
    xp = get_array_module(logp)
    logp[..., pad_id] = -xp.inf
    logp[..., bos_id] = -xp.inf
    return logp


def force_end(logp, force_eos, eos_id: int):
    """Rows ``force_eos`` (bool over the first axis) have spent their length budget and may only end:
    every other token becomes -inf, EOS keeps the model's own log-probability (fairseq's rule; a free
    EOS at log-probability 0 would favour hypotheses cut off by the limit). In place."""
    xp = get_array_module(logp)
    eos = logp[force_eos, ..., eos_id]  # advanced indexing: a copy
    logp[force_eos] = -xp.inf
    logp[force_eos, ..., eos_id] = eos
    return logp


def greedy_pick(logits, pad_id: int, bos_id: int, eos_id: int, force_eos):
    """The next token of each row and its log-probability: (N, V) logits -> ((N,) ids, (N,) log p).

    ``y_t = argmax_w log p(w | y_<t, x)`` with padding and BOS banned and EOS forced on the rows
    ``force_eos`` (N,) bool.
    """
    xp = get_array_module(logits)
    logp = force_end(ban_special(log_softmax(logits), pad_id, bos_id), force_eos, eos_id)
    nxt = logp.argmax(axis=1)
    return nxt, xp.take_along_axis(logp, nxt[:, None], axis=1)[:, 0]


def beam_candidates(logits, scores, n: int, pad_id: int, bos_id: int, eos_id: int, force_eos):
    """The ``n`` best one-token extensions of each sentence's k beams, best first.

    logits (m*k, V) for beam j of sentence s in row s*k + j, scores (m, k) the beams' log-probabilities so
    far (-inf for an unused beam), force_eos (m,) bool -> (index (m, n) into the k*V extensions, so
    beam = index // V and token = index % V; their scores (m, n)), where an extension scores
    ``cand[s, j*V + w] = scores[s, j] + log p(w | beam j of s)`` (padding and BOS banned, EOS forced).
    """
    xp = get_array_module(logits)
    m, k = scores.shape
    logp = ban_special(log_softmax(logits), pad_id, bos_id).reshape(m, k, -1)
    cand = (scores[:, :, None] + force_end(logp, force_eos, eos_id)).reshape(m, -1)
    best = xp.argsort(-cand, axis=1)[:, :n]
    return best, xp.take_along_axis(cand, best, axis=1)


def max_lengths(src, pad_id: int, a: float, b: int, cap: int | None = None):
    """Per-sentence output budget ``a * source_length + b`` (source length without padding), as host ints,
    at most ``cap`` (the positional table: decoder position t holds the t-th input token, BOS at 0)."""
    src_len = to_host((src != pad_id).sum(axis=1))
    return (a * src_len + b).astype(int).clip(min=1, max=cap)


@dataclass
class Hypothesis:
    tokens: list       # output token ids, without BOS and EOS
    logprob: float     # sum of the model's log-probabilities, EOS included
    score: float       # logprob / length_penalty(len(tokens) + 1)


def greedy_search(model, src, bos_id: int, eos_id: int, max_len_a: float = PAPER_MAX_LEN_A,
                  max_len_b: int = PAPER_MAX_LEN_B, use_cache: bool = True):
    """Pick the most probable token at every step, for a batch of sentences.

    src (B, S) -> list of B Hypothesis (length penalty alpha 0: score = logprob).
    ``use_cache=False`` re-runs the decoder over the whole prefix at every step
    (the reference the cached path is tested against).
    """
    xp = model.xp
    src = xp.asarray(src)
    pad = model.cfg.pad_id
    n = src.shape[0]
    limits = max_lengths(src, pad, max_len_a, max_len_b, model.cfg.max_len)
    memory, src_mask = model.encode(src)
    cache = model.new_decoder_caches()
    active = list(range(n))                  # original index of each sentence still searching
    tokens = xp.full((n, 1), bos_id, dtype=src.dtype)
    logprob = xp.zeros(n, dtype=memory.dtype)
    limits_act = xp.asarray(limits)
    out = [None] * n
    for t in range(int(limits.max())):
        if use_cache:
            logits = model.decode_step(tokens[:, -1], memory, src_mask, cache, position=t)
        else:
            logits = model.forward(src, tokens)[:, -1, :]
        # the most probable token (padding and BOS banned, EOS forced at the budget) and its log-probability
        nxt, gained = kernel(greedy_pick)(logits, pad, bos_id, eos_id, force_eos=limits_act == t + 1)
        logprob += gained
        tokens = xp.concatenate([tokens, nxt[:, None].astype(tokens.dtype)], axis=1)
        ended = to_host(nxt == eos_id)
        if not ended.any():
            continue
        # sentences that ended are set aside; the others go on in a smaller batch
        ended_dev = xp.asarray(ended)
        host_tokens, host_logprob = to_host(tokens[ended_dev, 1:-1]), to_host(logprob[ended_dev])
        for i, row, lp in zip([a for a, e in zip(active, ended) if e], host_tokens, host_logprob):
            out[i] = Hypothesis([int(x) for x in row], float(lp), float(lp))
        if ended.all():
            break
        stay = xp.asarray([i for i, e in enumerate(ended) if not e], dtype=xp.int64)
        active = [a for a, e in zip(active, ended) if not e]
        tokens, logprob, limits_act = tokens[stay], logprob[stay], limits_act[stay]
        memory, src_mask, src = memory[stay], src_mask[stay], src[stay]
        if use_cache:
            cache.take_rows_(stay)
    return out


def beam_search(model, src, bos_id: int, eos_id: int, beam: int = PAPER_BEAM, alpha: float = PAPER_ALPHA,
                max_len_a: float = PAPER_MAX_LEN_A, max_len_b: int = PAPER_MAX_LEN_B, nbest: int = 1):
    """Beam search with the GNMT length penalty for a batch of sentences.

    src (B, S) -> list of B lists of ``nbest`` Hypothesis, best first.

    Each step extends every live hypothesis, keeps the 2*beam best candidates per
    sentence, sets those ending in EOS among the best ``beam`` aside as finished
    (scored with the length penalty) and continues with the best ``beam`` that do
    not end. A sentence is
    finished once ``beam`` hypotheses have ended (fairseq's rule) or its length
    budget ``max_len_a * source_length + max_len_b`` is spent (EOS is forced, scored with the
    model's own EOS log-probability). Only live hypotheses reach the decoder: one per sentence at the
    first step (its k beams would all be BOS alone), then the k that continue; ended ones are set aside.
    """
    xp = model.xp
    src = xp.asarray(src)
    pad = model.cfg.pad_id
    n, k = src.shape[0], beam
    limits = max_lengths(src, pad, max_len_a, max_len_b, model.cfg.max_len)
    # one encoder output per sentence, shared by its k beams (decoder rows are sentence-major: s*k + j)
    memory, src_mask = model.encode(src)
    # the first step feeds one hypothesis per sentence (its k beams would all be BOS alone: the same
    # projection and log-sum-exp k times); its 2k best extensions then fill the k beams
    live = 1                                # hypotheses per sentence fed to the decoder this step
    cache = model.new_decoder_caches(beam=live)
    active = list(range(n))                 # original index of each sentence still searching
    limits_act = xp.asarray(limits)         # their length budgets
    history = xp.full((n, 0), pad, dtype=src.dtype)
    last = xp.full(n, bos_id, dtype=src.dtype)
    scores = xp.zeros((n, live), dtype=memory.dtype)
    finished = [[] for _ in range(n)]
    t = 0
    while active:
        m = len(active)
        logits = model.decode_step(last, memory, src_mask, cache, position=t)
        vocab = logits.shape[-1]
        force_eos = limits_act == t + 1
        # the 2k best of scores + log_softmax(logits) over each sentence's k*V extensions, best first
        # (padding and BOS banned, EOS the only extension where the budget is spent)
        top, top_scores = kernel(beam_candidates)(logits, scores, 2 * k, pad, bos_id, eos_id, force_eos)
        origin, token = top // vocab, top % vocab
        # an EOS candidate ends a hypothesis only if it ranks among the best k (fairseq's rule):
        # EOS among the 2k is otherwise a poor ending that would fill the finished list early
        ends = (token == eos_id) & xp.isfinite(top_scores)
        is_eos = ends & (xp.arange(2 * k)[None, :] < k)

        # set finished hypotheses aside (host bookkeeping only for the EOS events)
        if bool(is_eos.any()):
            rows, cols = (to_host(a) for a in xp.nonzero(is_eos))
            host_hist = to_host(history.reshape(m, live, -1))
            host_origin, host_scores = to_host(origin), to_host(top_scores)
            penalty = length_penalty(t + 1, alpha)
            for r, c in zip(rows, cols):
                s = active[r]
                if len(finished[s]) < k:
                    lp = float(host_scores[r, c])
                    finished[s].append(Hypothesis([int(x) for x in host_hist[r, host_origin[r, c]]], lp, lp / penalty))

        # the best k candidates that do not end continue
        alive = ~ends & xp.isfinite(top_scores)
        rank = xp.cumsum(alive, axis=1) - 1
        keep = alive & (rank < k)
        # positions of kept candidates, k per row (rows with fewer are padded with -inf scores)
        sort_key = xp.where(keep, rank, 2 * k + xp.arange(2 * k)[None, :])
        pick = xp.argsort(sort_key, axis=1)[:, :k]
        new_scores = xp.take_along_axis(xp.where(keep, top_scores, -xp.inf), pick, axis=1)
        new_origin = xp.take_along_axis(origin, pick, axis=1)
        new_token = xp.take_along_axis(token, pick, axis=1)

        # which sentences are over: k finished, or the budget spent
        host_done = [len(finished[s]) >= k for s in active]
        host_done = [d or bool(f) for d, f in zip(host_done, to_host(force_eos))]
        stay = [i for i, d in enumerate(host_done) if not d]
        beam_rows = (xp.arange(m)[:, None] * live + new_origin).reshape(-1)
        if len(stay) < m:
            stay_dev = xp.asarray(stay, dtype=xp.int64)
            beam_rows = beam_rows.reshape(m, k)[stay_dev].reshape(-1)
            new_scores, new_token = new_scores[stay_dev], new_token[stay_dev]
            # the encoder side (memory, its mask, the encoder-decoder keys/values) keeps the staying sentences
            memory, src_mask = memory[stay_dev], src_mask[stay_dev]
            if stay:
                cache.take_sentences_(stay_dev)
            limits_act = limits_act[stay_dev]
            active = [active[i] for i in stay]
        if not active:
            break
        # each new beam continues its parent's prefix: the self-attention keys/values follow it
        cache.take_hypotheses_(beam_rows)
        if live != k:  # after the first step: k hypotheses per sentence from now on
            live = k
            cache.set_beam(k)
        history = xp.concatenate([history[beam_rows], new_token.reshape(-1, 1).astype(history.dtype)], axis=1)
        last = new_token.reshape(-1).astype(history.dtype)
        scores = new_scores
        t += 1

    results = []
    for hyps in finished:
        hyps = sorted(hyps, key=lambda h: h.score, reverse=True)
        results.append(hyps[:nbest])
    return results
