"""Presets match Table 3 of the paper, and the closed-form count matches the built model."""
import pytest

from numformer.errors import UsageError
from numformer.model import Transformer
from numformer.presets import PRESETS, TABLE3, ModelConfig, count_parameters, get_preset


def test_base_with_37k_vocabulary_is_between_60m_and_66m():
    cfg = get_preset("base", vocab_size=37000)
    n = Transformer(cfg).num_parameters()
    assert 60e6 <= n <= 66e6, n
    assert n == count_parameters(cfg)


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_table3_counts_within_7_percent_of_the_paper(name):
    cfg, paper = TABLE3[name]
    n = count_parameters(cfg)
    assert abs(n - paper) / paper < 0.07, (name, n, paper)


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False), dict(pre_norm=True), dict(d_k=16, d_v=64),
                                dict(decoder_layers=1)])
def test_formula_equals_built_model(kw):
    cfg = get_preset("tiny", vocab_size=97, **kw)
    assert Transformer(cfg).num_parameters() == count_parameters(cfg)


def test_paper_settings():
    base, big = PRESETS["base"], PRESETS["big"]
    assert (base.layers, base.d_model, base.d_ff, base.heads, base.dropout, base.label_smoothing) == (6, 512, 2048, 8, 0.1, 0.1)
    assert base.head_dim_k == 64 and base.tie_embeddings and not base.pre_norm
    assert (big.layers, big.d_model, big.d_ff, big.heads, big.dropout) == (6, 1024, 4096, 16, 0.3)
    assert (PRESETS["small"].layers, PRESETS["small"].d_model, PRESETS["small"].heads) == (3, 256, 4)
    assert (PRESETS["tiny"].layers, PRESETS["tiny"].d_model, PRESETS["tiny"].d_ff) == (2, 128, 512)


def test_unknown_preset_message():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        get_preset("huge")


def test_config_round_trip():
    cfg = get_preset("small", pre_norm=True)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_an_impossible_config_is_refused_up_front():
    with pytest.raises(UsageError, match="d_model 128 is not divisible by heads 3"):
        get_preset("tiny", heads=3)
    with pytest.raises(UsageError, match="dropout must be in"):
        ModelConfig(dropout=1.5).checked()
