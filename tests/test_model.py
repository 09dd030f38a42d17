"""Whole-model behaviour: masks, padding invariance, incremental decoding equals the full pass."""
import numpy as np

from numformer.layers import ScaledDotProductAttention
from numformer.model import Transformer, causal_mask, padding_mask
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


def test_decode_step_equals_full_forward():
    for kw in (dict(), dict(pre_norm=True)):
        m = model(**kw).eval()
        src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]])
        tgt = np.array([[2, 12, 13, 14], [2, 15, 16, 17]])
        full = m(src, tgt)
        memory, src_mask = m.encode(src)
        caches = m.new_decoder_caches()
        steps = [m.decode_step(tgt[:, t], memory, src_mask, caches, position=t) for t in range(tgt.shape[1])]
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
