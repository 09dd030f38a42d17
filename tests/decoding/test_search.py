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


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_forced_eos_keeps_the_models_log_probability(search):
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1, dropout=0.0)
    model = Transformer(cfg, seed=3).eval()
    bos, eos = 2, 3
    src = np.random.default_rng(0).integers(4, 40, size=(6, 5))
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
