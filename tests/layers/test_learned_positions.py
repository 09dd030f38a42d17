"""Learned positional embedding (Table 3 row E, numformer/layers/learned_positions.py): the forward and backward
equations, accumulation into a shared table, offsets, the one-line error past the table; a model with
positional="learned": its parameter count, a training step, a checkpoint round trip (and an old model file
without the field), and decoding with the incremental cache equal to the full forward."""
import numpy as np
import pytest

from numformer.checkpoint import load_checkpoint, save_checkpoint
from numformer.checkpoint.trained_model import load_model
from numformer.decoding.search import beam_search, greedy_search
from numformer.decoding.translation import DecodeOptions, translate_ids
from numformer.layers import LearnedPositionalEmbedding, PositionalEncoding
from numformer.layers.learned_positions import INIT_STD
from numformer.layers.registry import layer_class
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import Adam
from numformer.presets import ModelConfig, count_parameters, get_preset

D = 8


def layer(max_len=12, seed=0, **kw):
    return LearnedPositionalEmbedding(D, max_len, dtype=np.float64, rng=np.random.default_rng(seed), **kw)


def cfg(**kw):
    base = dict(vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2, dropout=0.0, max_len=24,
                positional="learned")
    base.update(kw)
    return get_preset("tiny", **base)


def batch(rng):
    src = rng.integers(4, 40, size=(3, 7))
    tgt = rng.integers(4, 40, size=(3, 6))
    src[1, 5:], src[2, :] = 0, 0  # padding, and a source row that is all padding (fully masked attention rows)
    tgt[1, 4:] = 0
    return src, tgt


def test_forward_adds_the_rows_from_the_offset_and_caches_only_in_training():
    m = layer()
    x = np.random.default_rng(1).standard_normal((3, 5, D))
    np.testing.assert_array_equal(m(x), x + m.weight.data[None, :5])
    np.testing.assert_array_equal(m(x, offset=4), x + m.weight.data[None, 4:9])
    assert m.saved["offset"] == 4
    m.eval()
    m.release_saved()
    m(x, offset=2)
    assert not m.saved  # decoding holds nothing for a backward
    with pytest.raises(RuntimeError, match="without a forward in training mode"):
        m.backward(x)


def test_backward_is_dy_and_the_batch_sum_into_the_rows_used():
    m = layer()
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((3, 5, D)), rng.standard_normal((3, 5, D))
    m(x, offset=4)
    dx = m.backward(dy)
    np.testing.assert_array_equal(dx, dy)
    expect = np.zeros_like(m.weight.data)
    expect[4:9] = dy.sum(axis=0)  # every sentence used rows 4..8; no other row was touched
    np.testing.assert_allclose(m.weight.grad, expect, rtol=1e-15)
    assert not m.saved  # what forward saved is dropped


def test_backward_accumulates_into_a_shared_table():
    """Two uses of one table (tied-style) and a gradient already there: every contribution is added."""
    src = layer()
    tgt = layer(weight=src.weight)
    assert tgt.weight is src.weight
    rng = np.random.default_rng(3)
    before = rng.standard_normal(src.weight.shape)
    src.weight.grad[...] = before
    dy_src, dy_tgt = rng.standard_normal((2, 6, D)), rng.standard_normal((2, 4, D))
    src(rng.standard_normal((2, 6, D)))
    tgt(rng.standard_normal((2, 4, D)), offset=3)
    tgt.backward(dy_tgt)
    src.backward(dy_src)
    expect = before.copy()
    expect[0:6] += dy_src.sum(axis=0)
    expect[3:7] += dy_tgt.sum(axis=0)
    np.testing.assert_allclose(src.weight.grad, expect, rtol=1e-14)
    with pytest.raises(ValueError, match=r"shared positional table has shape \(12, 8\), expected \(5, 8\)"):
        LearnedPositionalEmbedding(D, 5, weight=src.weight)


def test_more_positions_than_the_table_is_one_line_like_the_sinusoids():
    x = np.zeros((1, 4, D))
    with pytest.raises(ValueError) as learned:
        layer(max_len=10)(x, offset=7)
    with pytest.raises(ValueError) as sinusoids:
        PositionalEncoding(D, 10)(x, offset=7)
    assert str(learned.value) == str(sinusoids.value) == (
        "sequence of 11 positions exceeds the positional table (10); raise max_len in the model config")
    layer(max_len=10)(x, offset=6)  # exactly the table: fine


def test_init_scale_matches_the_sinusoids_and_other_weights_match_base():
    """Rows drawn with entries of mean square 1/2, the sinusoid rows' exactly; every other weight is that of
    the sinusoidal model of the same seed, so row E differs from base in the positions alone."""
    table = layer(max_len=4000, seed=5).weight.data
    assert abs(float((table ** 2).mean()) - INIT_STD ** 2) < 0.01
    learned = Transformer(cfg(), seed=4).state_dict()
    sinusoidal = Transformer(cfg(positional="sinusoidal"), seed=4).state_dict()
    assert set(learned) - set(sinusoidal) == {"src_pos.weight", "tgt_pos.weight"}
    assert all(np.array_equal(sinusoidal[k], learned[k]) for k in sinusoidal)
    assert not np.array_equal(learned["src_pos.weight"], learned["tgt_pos.weight"])  # one table per stack
    np.testing.assert_array_equal(Transformer(cfg(), seed=4).state_dict()["tgt_pos.weight"],
                                  learned["tgt_pos.weight"])  # deterministic in the seed


def test_the_model_builds_the_registered_class_with_two_tables_counted():
    m = Transformer(cfg(), seed=0)
    assert type(m.src_pos) is type(m.tgt_pos) is layer_class("LearnedPositionalEmbedding")
    assert m.src_pos.weight.shape == m.tgt_pos.weight.shape == (24, 16)
    assert m.num_parameters() == count_parameters(m.cfg)
    assert m.num_parameters() - Transformer(cfg(positional="sinusoidal")).num_parameters() == 2 * 24 * 16
    for kw in (dict(tie_embeddings=False), dict(pre_norm=True), dict(d_k=4, d_v=8), dict(decoder_layers=1)):
        assert Transformer(cfg(**kw)).num_parameters() == count_parameters(cfg(**kw))


def test_a_training_step_moves_the_rows_used_and_no_other():
    m = Transformer(cfg(dropout=0.1), seed=1)
    src, tgt = batch(np.random.default_rng(4))
    crit = LabelSmoothedCrossEntropy(0.1, 0)
    before = {k: v.copy() for k, v in m.state_dict().items()}
    opt = Adam(m.parameters(), lr=1e-2)
    loss = float(crit.forward(m(src, tgt[:, :-1]), tgt[:, 1:]))
    m.backward(crit.backward())
    assert np.abs(m.src_pos.weight.grad[:7]).min() > 0 and not m.src_pos.weight.grad[7:].any()
    assert np.abs(m.tgt_pos.weight.grad[:5]).min() > 0 and not m.tgt_pos.weight.grad[5:].any()
    opt.step(zero_grad=True)
    after = m.state_dict()
    for name, used in (("src_pos.weight", 7), ("tgt_pos.weight", 5)):
        assert (after[name][:used] != before[name][:used]).all()
        np.testing.assert_array_equal(after[name][used:], before[name][used:])  # no gradient, no Adam update
    again = float(crit.forward(m(src, tgt[:, :-1]), tgt[:, 1:]))
    assert np.isfinite(loss) and np.isfinite(again)


def test_checkpoint_round_trip_and_an_old_model_file_without_the_field(tmp_path):
    model = Transformer(cfg(), seed=2, dtype=np.float64)
    model.src_pos.weight.data[0, 0] = 7.0  # a trained-looking table, not the one a fresh model draws
    save_checkpoint(tmp_path / "learned.npz", model.state_dict(), {"model_config": model.cfg.to_dict()})
    ck = load_checkpoint(tmp_path / "learned.npz", with_optimizer=False)
    assert {"model/src_pos.weight", "model/tgt_pos.weight"} <= {f"model/{k}" for k in ck.model}
    back = Transformer(ModelConfig.from_dict(ck.meta["model_config"]), seed=9, dtype=np.float64)
    back.load_state_dict(ck.model)
    src, tgt = batch(np.random.default_rng(5))
    np.testing.assert_array_equal(back.eval()(src, tgt), model.eval()(src, tgt))

    # a model file written before ModelConfig had "positional": it is the paper's sinusoidal model
    old = Transformer(cfg(positional="sinusoidal"), seed=3)
    old_config = old.cfg.to_dict()
    del old_config["positional"]
    save_checkpoint(tmp_path / "old.npz", old.state_dict(), {"model_config": old_config})
    ck = load_checkpoint(tmp_path / "old.npz", with_optimizer=False)
    restored = ModelConfig.from_dict(ck.meta["model_config"]).checked()
    assert restored.positional == "sinusoidal"
    Transformer(restored).load_state_dict(ck.model)
    with pytest.raises(ValueError, match=r"missing \['src_pos.weight', 'tgt_pos.weight'\]"):
        Transformer(restored.replace(positional="learned")).load_state_dict(ck.model)


def test_a_learned_model_file_translates_long_lines_within_its_table(random_run, tmp_path):
    """load_model builds the learned model from the file's config; translation keeps every source and output
    within the table (long lines split, outputs capped) exactly as for the sinusoids."""
    from numformer.data import SubwordVocab  # noqa: PLC0415

    vocab = SubwordVocab.load(random_run / "spm.model")
    model = Transformer(get_preset("tiny", vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=1,
                                   max_len=12, positional="learned"), seed=0)
    save_checkpoint(tmp_path / "run" / "checkpoints" / "step_0000001.npz", model.state_dict(),
                    {"model_config": model.cfg.to_dict()}, vocab=vocab.to_bytes())
    loaded, _, _ = load_model(tmp_path / "run")
    assert type(loaded.src_pos) is LearnedPositionalEmbedding
    np.testing.assert_array_equal(loaded.tgt_pos.weight.data, model.tgt_pos.weight.data)
    ids = [list(range(5, 35)), [6, 7, 8]]  # 30 tokens: more than the 11 a source of this table holds
    results = translate_ids(loaded, ids, vocab.bos_id, vocab.eos_id, DecodeOptions(beam=2, max_len_b=50))
    assert len(results) == 2 and all(len(r[0][0]) <= 3 * 12 for r in results)  # three pieces, each capped


def test_incremental_decoding_equals_the_full_forward():
    for kw in (dict(), dict(pre_norm=True, tie_embeddings=False)):
        m = Transformer(cfg(**kw), seed=6, dtype=np.float64).eval()
        src = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]])
        tgt = np.array([[2, 12, 13, 14, 15], [2, 16, 17, 18, 19]])
        full = m(src, tgt)
        memory, src_mask = m.encode(src)
        cache = m.new_decoder_caches()
        steps = [m.decode_step(tgt[:, t], memory, src_mask, cache, position=t) for t in range(tgt.shape[1])]
        np.testing.assert_allclose(np.stack(steps, axis=1), full, rtol=1e-10, atol=1e-10)
        cached = greedy_search(m, src, 2, 3, max_len_b=30)
        assert [h.tokens for h in cached] == [h.tokens for h in greedy_search(m, src, 2, 3, max_len_b=30,
                                                                               use_cache=False)]
        assert all(len(h.tokens) < m.cfg.max_len for h in cached)  # capped at the table
        assert len(beam_search(m, src, 2, 3, beam=3, max_len_b=30)) == 2
        with pytest.raises(ValueError, match="sequence of 25 positions exceeds the positional table \\(24\\)"):
            m.decode_step(tgt[:, 0], memory, src_mask, m.new_decoder_caches(), position=24)
