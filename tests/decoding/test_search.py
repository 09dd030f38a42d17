"""The searches (numformer/decoding/search.py, Section 6.1): the grouped beam step equals the plain step on repeated
memory, and EOS forced at the length limit keeps the model's own log-probability (fairseq's rule)."""
import numpy as np
import pytest

from numformer.decoding.search import beam_search, greedy_search, log_softmax
from numformer.model import Transformer
from numformer.presets import get_preset


def test_grouped_beam_step_equals_the_step_on_repeated_memory():
    """decode_step with a beam-k cache (one memory row per sentence) equals the plain step on memory repeated k times,
    across a beam permutation of the self-attention caches and a sentence leaving the batch."""
    from numformer.model import Transformer
    from numformer.presets import get_preset

    for pre_norm in (False, True):
        m = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, max_len=64,
                                   pre_norm=pre_norm), seed=1, dtype=np.float64).eval()
        k = 3
        src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]])
        memory, mask = m.encode(src)
        rep = np.repeat(np.arange(2), k)
        grouped, plain = m.new_decoder_caches(beam=k), m.new_decoder_caches()
        mem_p, mask_p = memory[rep], mask[rep]
        rng = np.random.default_rng(4)
        for t in range(6):
            rows = mem_p.shape[0]
            tokens = rng.integers(3, 30, rows)
            a = m.decode_step(tokens, memory, mask, grouped, position=t)
            b = m.decode_step(tokens, mem_p, mask_p, plain, position=t)
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
            if t == 2:  # beams swap parents inside each sentence
                perm = np.array([1, 1, 0, 5, 3, 4])
                grouped.take_hypotheses_(perm)
                plain.take_rows_(perm)
            if t == 4:  # sentence 0 is done: only sentence 1's beams go on
                stay = np.array([1])
                grouped.take_hypotheses_(np.arange(3, 6))
                grouped.take_sentences_(stay)
                plain.take_rows_(np.arange(3, 6))
                memory, mask, mem_p, mask_p = memory[stay], mask[stay], mem_p[3:], mask_p[3:]


def teacher_forced_logprob(model, src_row, tokens, bos, eos):
    """sum of log P(token) over tokens + [EOS], by a full forward pass."""
    tgt = [bos] + list(tokens) + [eos]
    logits = np.asarray(model(np.asarray([src_row]), np.asarray([tgt[:-1]])))[0].astype(np.float64)
    logp = log_softmax(logits)
    return float(sum(logp[t, tok] for t, tok in enumerate(tgt[1:])))


# a Marian (opus-mt) model: eos 0, pad 39 (the last row) and the decoder starting from pad (bos == pad), SiLU,
# a non-zero frozen logits bias (in the cached steps' logits as in the full forward's), the pad row's rule
MARIAN = dict(activation="silu", logits_bias=True, pad_row_gradient=False, pad_id=39)


@pytest.mark.parametrize("start", ["bos", "pad"])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_forced_eos_keeps_the_models_log_probability(search, start):
    """Cached decoding scores a hypothesis as a full forward pass does; ``start`` pad: a Marian model whose
    decoder starts from pad (bos == pad: banned once, never generated)."""
    marian = start == "pad"
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1, dropout=0.0,
                     **(MARIAN if marian else {}))
    model = Transformer(cfg, seed=3).eval()
    bos, eos = (39, 0) if marian else (2, 3)
    if marian:
        model.final_logits_bias[...] = np.random.default_rng(1).standard_normal(40)
    src = np.random.default_rng(0).integers(4, 39 if marian else 40, size=(6, 5))
    limit = 3  # max_len_a 0, max_len_b 3: at most two tokens and the (forced) EOS
    if search == "greedy":
        hyps = greedy_search(model, src, bos, eos, max_len_a=0.0, max_len_b=limit)
    else:
        hyps = [h[0] for h in beam_search(model, src, bos, eos, beam=2, alpha=0.0, max_len_a=0.0, max_len_b=limit)]
    forced = [i for i, h in enumerate(hyps) if len(h.tokens) == limit - 1]
    assert forced, "no hypothesis reached the limit: pick another seed"
    for i in forced:
        expected = teacher_forced_logprob(model, src[i], hyps[i].tokens, bos, eos)
        assert hyps[i].logprob == pytest.approx(expected, abs=1e-4)
    assert not [t for h in hyps for t in h.tokens if t in (bos, cfg.pad_id)]
    if marian and search == "greedy":  # the uncached search (full forwards of the prefix from pad) agrees
        again = greedy_search(model, src, bos, eos, max_len_a=0.0, max_len_b=limit, use_cache=False)
        assert [h.tokens for h in again] == [h.tokens for h in hyps]
        np.testing.assert_allclose([h.logprob for h in again], [h.logprob for h in hyps], rtol=1e-4)


def test_beam_search_feeds_one_hypothesis_per_sentence_at_its_first_step():
    """At the first step a sentence's k beams would all be BOS alone: beam search feeds one row per sentence
    (no projection or log-sum-exp for the k-1 empty beams), then k rows per sentence still searching."""
    m = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, max_len=64), seed=3,
                    dtype=np.float64).eval()
    src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3], [12, 13, 3, 0, 0]])
    fed = []
    step = m.decode_step

    def counting_step(tokens, *args, **kwargs):
        fed.append(len(tokens))
        return step(tokens, *args, **kwargs)

    m.decode_step = counting_step
    try:
        hyps = beam_search(m, src, bos_id=1, eos_id=3, beam=4, max_len_b=6)
    finally:
        del m.decode_step
    assert fed[0] == 3
    assert fed[1] == 3 * 4
    assert all(n % 4 == 0 for n in fed[1:])
    assert [len(h) for h in hyps] == [1, 1, 1]
