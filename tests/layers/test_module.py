"""Module bookkeeping: names, tying, state dicts, train/eval, zero_grad."""
import numpy as np
import pytest

from numformer.model import Transformer
from numformer.presets import get_preset


def small_model(**kw):
    return Transformer(get_preset("tiny", vocab_size=50, d_model=16, d_ff=32, heads=2, **kw), seed=3)


def test_stable_dotted_names():
    names = [n for n, _ in small_model().named_parameters()]
    assert names[0] == "src_embed.weight"
    assert "encoder.layers.0.self_attn.w_q.weight" in names
    assert "decoder.layers.1.cross_attn.w_o.bias" in names
    assert "decoder.layers.0.ffn_residual.norm.weight" in names
    assert names == [n for n, _ in small_model().named_parameters()]
    assert len(names) == len(set(names))


def test_tied_weight_listed_once_and_collects_every_gradient():
    m = small_model()
    names = [n for n, _ in m.named_parameters()]
    assert "tgt_embed.weight" not in names and "generator.weight" not in names
    assert m.src_embed.weight is m.tgt_embed.weight is m.generator.weight
    untied = small_model(tie_embeddings=False)
    assert {"src_embed.weight", "tgt_embed.weight", "generator.weight"} <= {n for n, _ in untied.named_parameters()}


def test_state_dict_is_host_numpy_and_round_trips():
    a, b = small_model(), Transformer(small_model().cfg, seed=99)
    sd = a.state_dict()
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    b.load_state_dict(sd)
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        assert n1 == n2 and np.array_equal(p1.data, p2.data)
    sd["src_embed.weight"][0, 0] += 1  # the state dict is a copy, not a view
    assert a.src_embed.weight.data[0, 0] != sd["src_embed.weight"][0, 0]


def test_load_state_dict_errors_name_the_tensor():
    m = small_model()
    sd = m.state_dict()
    sd["encoder.layers.0.ffn.w_1.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="encoder.layers.0.ffn.w_1.weight"):
        m.load_state_dict(sd)
    sd = m.state_dict()
    del sd["decoder.layers.0.self_attn.w_q.bias"]
    with pytest.raises(ValueError, match="missing"):
        m.load_state_dict(sd)


def test_train_eval_and_zero_grad():
    m = small_model()
    assert all(x.training for x in m.modules())
    m.eval()
    assert not any(x.training for x in m.modules())
    m.train()
    src = np.array([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = np.array([[2, 9, 10], [2, 11, 0]])
    logits = m(src, tgt)
    m.backward(np.ones_like(logits))
    assert any(np.abs(p.grad).sum() > 0 for p in m.parameters())
    m.zero_grad()
    assert all(np.abs(p.grad).sum() == 0 for p in m.parameters())


def test_eval_mode_caches_nothing():
    m = small_model().eval()
    m(np.array([[5, 6, 3]]), np.array([[2, 7]]))
    cached = [(type(x).__name__, sorted(x.saved)) for x in m.modules() if x.saved]
    assert not cached, cached


def test_float64_cast_and_seed_reproducibility():
    a, b = small_model(), small_model()
    assert all(np.array_equal(p.data, q.data) for p, q in zip(a.parameters(), b.parameters()))
    a.to(dtype=np.float64)
    assert all(p.data.dtype == np.float64 and p.grad.dtype == np.float64 for p in a.parameters())
    assert a.src_pos.table.dtype == np.float64


def test_the_frozen_logits_bias_is_saved_loaded_and_never_trained():
    """final_logits_bias (logits_bias=True): a persistent buffer. In the state dict under that name and loaded back
    in place; not a parameter, so Adam, clipping and the gradient norm never see it; added to the logits; moved
    and cast with the model; a model without it has none in its state dict (old files load as before)."""
    from numformer.optim import Adam, clip_grad_norm

    m = small_model(logits_bias=True, pad_row_gradient=False, activation="silu")
    assert "final_logits_bias" not in [n for n, _ in m.named_parameters()]
    assert all(p is not m.final_logits_bias for p in m.parameters())
    sd = m.state_dict()
    assert list(sd)[-1] == "final_logits_bias" and sd["final_logits_bias"].shape == (50,)
    bias = np.random.default_rng(0).standard_normal(50).astype(np.float32)
    sd["final_logits_bias"] = bias
    held = m.final_logits_bias
    m.load_state_dict(sd)
    assert m.final_logits_bias is held and np.array_equal(held, bias)  # loaded in place
    with pytest.raises(ValueError, match="missing \\['final_logits_bias'\\]"):
        m.load_state_dict({k: v for k, v in sd.items() if k != "final_logits_bias"})
    with pytest.raises(ValueError, match="unexpected \\['final_logits_bias'\\]"):
        small_model().load_state_dict(sd)
    assert "final_logits_bias" not in small_model().state_dict()

    src, tgt = np.array([[5, 6, 7, 3], [8, 3, 0, 0]]), np.array([[0, 9, 10], [0, 11, 0]])  # start from pad (0)
    logits = m(src, tgt)
    plain = small_model(pad_row_gradient=False, activation="silu")(src, tgt)  # same seed: the same weights
    np.testing.assert_allclose(logits - bias, plain, rtol=1e-5, atol=1e-5)
    opt = Adam(m.parameters(), lr=1.0)
    before = m.src_embed.weight.data.copy()
    m.backward(np.random.default_rng(1).standard_normal(logits.shape).astype(np.float32))
    clip_grad_norm(m.parameters(), 0.1)
    opt.step(zero_grad=True)
    assert not np.array_equal(m.src_embed.weight.data, before)  # the trained weights moved,
    assert np.array_equal(m.final_logits_bias, bias)  # the bias did not
    m.to(dtype=np.float64)
    assert m.final_logits_bias.dtype == np.float64 and np.array_equal(m.final_logits_bias, bias)
