"""One model config every consumer reads (issue 69): the sub-layers take the config (``from_config``), not its fields
one by one, and keep their constructors for a layer built by hand; a class put in a layer's place without a
``from_config`` is built with numformer's arguments; the PyTorch mirror reads the config itself; and a model built
before is built again bit for bit: the same seed gives the same weights as the code of 4439216 (the SHA-256 of
each state dict, computed there, for five configs and two dtypes)."""
import hashlib

import numpy as np
import pytest

from numformer.backend import RandomState
from numformer.layers import FeedForward, LayerNorm, MultiHeadAttention, Residual
from numformer.layers.registry import replaced
from numformer.model import Transformer
from numformer.module import Module
from numformer.presets import ModelConfig, get_preset

# (config, seed, dtype) -> the first 32 hex digits of the SHA-256 of the state dict (names, dtypes, shapes and
# bytes, by name), from the code at 4439216, before the config was read through from_config and the norms' table
BEFORE = {
('tiny', 0, 'float32'): '7417d29277323c38bd9ebf5c051b0972',
    ('tiny', 7, 'float64'): 'c6b333a572f85a9c83697de09a246a07',
    ('pre-LN, untied, learned positions', 0, 'float32'): '6716605810552e3a6284667c6f7d3b98',
    ('pre-LN, untied, learned positions', 7, 'float64'): 'a23ec801c8b6afe05e92e7100e0f938a',
    ("Marian's: SiLU, logits bias, pad row rule", 0, 'float32'): 'c6d5ae7c6e46cbd58acada5c6e2dbbe7',
    ("Marian's: SiLU, logits bias, pad row rule", 7, 'float64'): 'e8642d2e2415c9211e99e45d8ead01cd',
    ('d_k 16 d_v 24, xavier, 3 decoder layers', 0, 'float32'): 'a9ef4cc0cf7cf6dc726260075124bc93',
    ('d_k 16 d_v 24, xavier, 3 decoder layers', 7, 'float64'): '9dd1722b9dc4a4aca714a2fd6b0e4f55',
    ('GELU tanh, pre-LN, eps 1e-6', 0, 'float32'): '48afd0c45bb27002993ebcb1854fd1bf',
    ('GELU tanh, pre-LN, eps 1e-6', 7, 'float64'): 'c40f6cba4aa6fee4713291fcb07f3d73',
}

CONFIGS = {
    "tiny": dict(),
    "pre-LN, untied, learned positions": dict(pre_norm=True, tie_embeddings=False, positional="learned"),
    "Marian's: SiLU, logits bias, pad row rule": dict(activation="silu", logits_bias=True, pad_row_gradient=False,
                                                      pad_id=99),
    "d_k 16 d_v 24, xavier, 3 decoder layers": dict(d_k=16, d_v=24, init="xavier", decoder_layers=3),
    "GELU tanh, pre-LN, eps 1e-6": dict(activation="gelu_tanh", pre_norm=True, ln_eps=1e-6),
}


def state_hash(model) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        value = np.ascontiguousarray(value)
        h.update(f"{name} {value.dtype} {value.shape}".encode())
        h.update(value.tobytes())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("key", list(BEFORE), ids=lambda k: f"{k[0]}-{k[1]}-{k[2]}")
def test_a_model_built_before_is_built_again_bit_for_bit(key):
    name, seed, dtype = key
    cfg = get_preset("tiny", vocab_size=100, max_len=64, **CONFIGS[name])
    assert state_hash(Transformer(cfg, seed=seed, dtype=np.dtype(dtype).type)) == BEFORE[key]


def test_a_changed_weight_changes_the_hash():
    """The check can fail: one weight's last bit flipped."""
    model = Transformer(get_preset("tiny", vocab_size=100, max_len=64), seed=0)
    model.encoder.layers[0].ffn.w_1.weight.data.view(np.uint32)[0, 0] ^= 1
    assert state_hash(model) != BEFORE[("tiny", 0, "float32")]


def _same_parameters(a, b):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(np.array_equal(pa[n].data, pb[n].data) for n in pa)


def test_each_sub_layer_from_the_config_is_the_one_built_by_hand():
    cfg = ModelConfig(vocab_size=50, d_model=12, d_ff=20, heads=3, d_k=5, d_v=6, attn_dropout=0.2, relu_dropout=0.1,
                      dropout=0.3, pre_norm=True, ln_eps=1e-6, init="xavier", activation="silu")
    a = MultiHeadAttention.from_config(cfg, np.random.default_rng(1), RandomState(0), np.float64)
    b = MultiHeadAttention(12, 3, 5, 6, 0.2, np.random.default_rng(1), RandomState(0), np.float64, "xavier")
    assert _same_parameters(a, b) and (a.d_k, a.d_v, a.attention.dropout.p) == (5, 6, 0.2)
    a = FeedForward.from_config(cfg, np.random.default_rng(2), RandomState(0), np.float64)
    b = FeedForward(12, 20, 0.1, np.random.default_rng(2), RandomState(0), np.float64, "xavier", activation="silu")
    assert _same_parameters(a, b) and type(a.activation) is type(b.activation) and a.dropout.p == 0.1
    a = Residual.from_config(cfg, RandomState(0), np.float64)
    assert a.pre_norm and a.dropout.p == 0.3 and type(a.norm) is LayerNorm and a.norm.eps == 1e-6
    assert a.norm.weight.data.dtype == np.float64 and a.norm.d == 12


def test_a_class_in_a_layers_place_without_from_config_is_built_with_numformers_arguments():
    """A user's class written against the constructor alone (not a subclass): built as numformer's own would be."""
    seen = []

    class MyResidual(Module):  # not a Residual: no from_config of its own
        def __init__(self, d_model, dropout=0.1, pre_norm=False, rng=None, eps=1e-5, dtype=np.float32,
                     norm="layernorm"):
            super().__init__()
            seen.append((d_model, dropout, pre_norm, eps, norm))
            self.inner = Residual(d_model, dropout, pre_norm, rng, eps, dtype, norm=norm)

        def forward(self, x, sublayer, *args, **kwargs):
            return self.inner(x, sublayer, *args, **kwargs)

    cfg = get_preset("tiny", vocab_size=30, pre_norm=True, dropout=0.2, ln_eps=1e-6)
    with replaced({"Residual": MyResidual}):
        model = Transformer(cfg)
    assert len(seen) == 2 * cfg.layers + 3 * cfg.n_decoder_layers
    assert set(seen) == {(cfg.d_model, 0.2, True, 1e-6, "layernorm")}
    assert type(model.decoder.layers[0].cross_attn_residual) is MyResidual


def test_the_mirror_reads_the_config_itself():
    from reference import torch_mirror as tm

    cfg = ModelConfig(d_model=12, heads=3, d_k=5, layers=2, decoder_layers=3, tie_embeddings=False)
    arch = tm.Arch.from_config(cfg)
    for field in cfg.to_dict():  # every field, one added later included: nothing is copied
        if field not in ("d_k", "d_v"):
            assert getattr(arch, field) == getattr(cfg, field), field
    assert (arch.d_k, arch.d_v, arch.n_enc, arch.n_dec, arch.tie) == (5, 5, 2, 3, False)
    with pytest.raises(AttributeError):
        arch.pre_norm = True
