"""Whole-model behaviour: masks, padding invariance, incremental decoding equals the full pass, cache reordering."""
import numpy as np

from numformer.layers import ScaledDotProductAttention
from numformer.layers.kv_cache import take_rows_
from numformer.model import Transformer, causal_mask, decoder_self_mask, padding_mask
from numformer.presets import get_preset


def model(**kw):
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, dropout=0.0, **kw)
    return Transformer(cfg, seed=1, dtype=np.float64)


def test_fully_masked_row_is_finite():
    att = ScaledDotProductAttention()
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 4))
    mask = np.zeros((1, 1, 1, 5), dtype=bool)
    out = att(q, k, v, mask)
    assert np.isfinite(out).all()
    dq, dk, dv = att.backward(rng.standard_normal(out.shape))
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape), atol=1e-12)


def test_masks():
    ids = np.array([[4, 5, 0], [6, 0, 0]])
    assert padding_mask(ids, 0).shape == (2, 1, 1, 3)
    assert padding_mask(ids, 0)[1, 0, 0].tolist() == [True, False, False]
    c = causal_mask(3)[0, 0]
    assert c.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_padding_does_not_change_real_positions():
    """Adding padding to a batch row leaves the logits of its real tokens unchanged."""
    m = model().eval()
    src = np.array([[5, 6, 7, 3]])
    tgt = np.array([[2, 9, 10]])
    a = m(src, tgt)
    src_p = np.array([[5, 6, 7, 3, 0, 0]])
    tgt_p = np.array([[2, 9, 10, 0]])
    b = m(src_p, tgt_p)
    np.testing.assert_allclose(a, b[:, :3], rtol=1e-10, atol=1e-10)


def test_future_tokens_do_not_leak():
    m = model().eval()
    src = np.array([[5, 6, 7, 3]])
    a = m(src, np.array([[2, 9, 10, 11]]))
    b = m(src, np.array([[2, 9, 12, 13]]))
    np.testing.assert_allclose(a[:, :2], b[:, :2], rtol=1e-12, atol=1e-12)
    assert not np.allclose(a[:, 2], b[:, 2])


MARIAN = dict(activation="silu", logits_bias=True, pad_row_gradient=False, pad_id=39)  # pad in the last row


def marian_model(**kw):
    """A model as a Marian (opus-mt) one computes: SiLU, a non-zero frozen logits bias, the pad row's gradient
    rule, pad 39 (the last row), decoder inputs that start with pad."""
    m = model(**MARIAN, **kw)
    m.final_logits_bias[...] = np.random.default_rng(3).standard_normal(40)
    return m


def test_the_start_position_is_never_padding_masked():
    """decoder_self_mask: causal AND not padding, except position 0. With BOS at position 0 (numformer's own
    models) it is causal_mask & padding_mask exactly, so the logits are bit for bit those of that mask; with pad
    there (Marian's start), query 0 sees key 0 instead of no key, and later pads stay masked."""
    tgt_in = np.array([[2, 9, 10, 0, 0], [2, 11, 0, 0, 0], [2, 4, 5, 6, 7]])
    np.testing.assert_array_equal(decoder_self_mask(tgt_in, 0), causal_mask(5) & padding_mask(tgt_in, 0))
    m = model()
    src = np.array([[5, 6, 7, 3, 0], [8, 3, 0, 0, 0], [4, 5, 6, 7, 3]])
    memory, src_mask = m.encode(src)
    y = m.tgt_dropout(m.tgt_pos(m.tgt_embed(tgt_in)))
    before = m.generator(m.decoder(y, memory, causal_mask(5) & padding_mask(tgt_in, 0), src_mask))
    assert np.array_equal(m(src, tgt_in), before)  # numformer's models: nothing changes, to the bit

    start = np.array([[0, 9, 10, 0], [0, 0, 0, 0]])  # bos == pad: a row with nothing but the start
    mask = decoder_self_mask(start, 0)[:, 0]
    assert mask[:, 0, 0].all() and mask.any(axis=-1).all()  # no query without a key
    assert mask[0, 3].tolist() == [True, True, True, False] and mask[1, 3].tolist() == [True, False, False, False]
    assert np.isfinite(m(src[:2, :4], start)).all()


def test_decode_step_equals_full_forward():
    for kw in (dict(), dict(pre_norm=True), MARIAN):
        m = (marian_model() if kw is MARIAN else model(**kw)).eval()
        src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]])
        tgt = np.array([[2, 12, 13, 14], [2, 15, 16, 17]])
        if kw is MARIAN:  # pad 39 and a start from pad, the logits bias in both paths
            src, tgt = np.where(src == 0, 39, src), np.where(np.arange(4) == 0, 39, tgt)
        full = m(src, tgt)
        memory, src_mask = m.encode(src)
        cache = m.new_decoder_caches()
        steps = [m.decode_step(tgt[:, t], memory, src_mask, cache, position=t) for t in range(tgt.shape[1])]
        np.testing.assert_allclose(np.stack(steps, axis=1), full, rtol=1e-10, atol=1e-10)


def test_tied_gradient_is_the_sum_of_three_uses():
    """The shared matrix's gradient equals the sum of what the three uses would get untied."""
    tied = model()
    untied = Transformer(tied.cfg.replace(tie_embeddings=False), seed=1, dtype=np.float64)
    state = tied.state_dict()
    full = dict(state)
    full["tgt_embed.weight"] = full["generator.weight"] = state["src_embed.weight"]
    untied.load_state_dict(full)
    src = np.array([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = np.array([[2, 9, 10], [2, 11, 0]])
    g = np.random.default_rng(0).standard_normal((2, 3, 40))
    tied(src, tgt)
    tied.backward(g)
    untied(src, tgt)
    untied.backward(g)
    total = untied.src_embed.weight.grad + untied.tgt_embed.weight.grad + untied.generator.weight.grad
    np.testing.assert_allclose(tied.src_embed.weight.grad, total, rtol=1e-10, atol=1e-12)


def test_the_pad_row_gets_gradient_from_the_projection_only():
    """pad_row_gradient False: neither embedding's lookups give the pad row gradient (torch's padding_idx), the
    pre-softmax projection still does, every other row is as with the rule off; tied, the shared row gets the
    projection's share alone. The decoder input starts with pad, so those lookups do reach the loss."""
    tied = marian_model()
    untied = Transformer(tied.cfg.replace(tie_embeddings=False), seed=1, dtype=np.float64)
    free = Transformer(untied.cfg.replace(pad_row_gradient=True), seed=1, dtype=np.float64)  # every row gradient
    state = tied.state_dict()
    full = dict(state)
    full["tgt_embed.weight"] = full["generator.weight"] = state["src_embed.weight"]
    untied.load_state_dict(full)
    free.load_state_dict(full)
    src = np.array([[5, 6, 7, 3], [8, 3, 39, 39]])
    tgt = np.array([[39, 9, 10], [39, 11, 39]])
    g = np.random.default_rng(0).standard_normal((2, 3, 40))
    for m in (tied, untied, free):
        m(src, tgt)
        m.backward(g)
    for name in ("src_embed", "tgt_embed"):
        assert not getattr(untied, name).weight.grad[39].any()
        np.testing.assert_array_equal(getattr(untied, name).weight.grad[:39], getattr(free, name).weight.grad[:39])
    assert free.tgt_embed.weight.grad[39].any()  # the start's lookups reach the loss
    assert untied.generator.weight.grad[39].any()
    total = untied.src_embed.weight.grad + untied.tgt_embed.weight.grad + untied.generator.weight.grad
    np.testing.assert_allclose(tied.src_embed.weight.grad, total, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tied.src_embed.weight.grad[39], untied.generator.weight.grad[39], rtol=1e-12)


def test_fully_masked_attention_row_is_uniform_and_finite():
    """Masked scores are replaced by -1e9: a query whose keys are all masked averages the values
    uniformly (no NaN), and its scores get no gradient."""
    from numformer.layers import ScaledDotProductAttention

    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    mask = np.ones((2, 1, 4, 4), dtype=bool)
    mask[0, 0, 1, 2:] = False
    mask[1, 0, 3, :] = False  # a row with every key masked
    attn = ScaledDotProductAttention()
    attn.record_weights = True
    out = attn(q, k, v, mask)
    scores = np.where(mask, q @ k.swapaxes(-1, -2) / np.sqrt(5), -1e9)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn.weights, p, rtol=1e-12)
    np.testing.assert_allclose(attn.weights[1, :, 3], 0.25)
    np.testing.assert_allclose(out, p @ v, rtol=1e-12)
    dq, dk, dv = attn.backward(rng.standard_normal(out.shape))
    assert np.isfinite(dq).all() and np.isfinite(dk).all()
    np.testing.assert_array_equal(dq[1, :, 3], 0.0)  # the fully masked query: no gradient


def test_growing_decoder_cache_and_reorder():
    """Cached decoding past the first buffer doubling (16 positions), with a beam-style reorder, equals
    full forwards of the reordered prefixes."""
    from numformer.presets import get_preset

    m = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, max_len=64), seed=0,
                    dtype=np.float64).eval()
    rng = np.random.default_rng(10)
    src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3], [4, 4, 5, 3, 0]])
    tgt = np.concatenate([np.full((3, 1), 2), rng.integers(4, 30, (3, 39))], axis=1)
    memory, src_mask = m.encode(src)
    cache = m.new_decoder_caches()
    prefix_rows = np.arange(3)
    for t in range(tgt.shape[1]):
        if t == 25:  # reorder: rows (2, 0) continue (the batch shrinks, as when beams are dropped)
            index = np.array([2, 0])
            cache.take_rows_(index)
            memory, src_mask, prefix_rows = memory[index], src_mask[index], prefix_rows[index]
        step = m.decode_step(tgt[prefix_rows, t], memory, src_mask, cache, position=t)
    full = m(src[prefix_rows], tgt[prefix_rows])[:, -1]
    np.testing.assert_allclose(step, full, rtol=1e-10, atol=1e-10)


def test_take_rows_in_place_permutation_and_shrink():
    rng = np.random.default_rng(2)
    buf = rng.standard_normal((5, 2, 8, 3))
    view = buf[:, :, :4]  # a cache view of the first 4 positions
    index = np.array([0, 0, 3, 2, 4])
    expected = view[index].copy()
    assert take_rows_(view, index) is view
    np.testing.assert_array_equal(view, expected)
    np.testing.assert_array_equal(buf[:, :, :4], expected)  # written through to the buffer
    shrunk = take_rows_(buf, np.array([4, 1]))
    np.testing.assert_array_equal(shrunk, buf[[4, 1]])
