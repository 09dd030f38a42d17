"""The gradient noise scale (numformer/training/gradient_noise_scale.py): the estimator is unbiased on synthetic
per-sentence gradients of known mean and covariance (and the naive one is not); every parameter belongs to a
layer type; ``--log-grads`` writes the per-tensor, per-type and total noise scale of the step's last batch to
grad_stats.jsonl, TensorBoard and the plot command draw it."""
import json

import numpy as np
import pytest

from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.plot import plot_noise_scale
from numformer.presets import ModelConfig
from numformer.training.gradient_statistics import GradientStatistics
from numformer.training.gradient_noise_scale import GROUPS, estimate, group_of, noise_scales
from numformer.training.per_sentence_gradients import PerSentenceGradients, SentenceGradients


def synthetic(rng, repeats, b, mean, std):
    """``repeats`` batches of b per-sentence gradients g = x / b, x ~ N(mean, diag(std^2)): (s, |G|^2) each."""
    x = mean + std * rng.standard_normal((repeats, b, mean.size))
    g = x / b
    return (g * g).sum(axis=(1, 2)), (g.sum(axis=1) ** 2).sum(axis=1)


def test_the_estimator_is_unbiased_on_gradients_of_known_covariance():
    rng = np.random.default_rng(0)
    mean, std = np.array([0.5, -1.0, 0.25, 0.0, 2.0]), np.array([1.0, 3.0, 0.5, 2.0, 1.5])
    true_g2, true_trace = float((mean ** 2).sum()), float((std ** 2).sum())
    for b in (2, 8, 64):
        s, g2 = synthetic(rng, 20000, b, mean, std)
        est = estimate(s, g2, b)  # elementwise over the repeats
        for got, true in ((est.grad_sq, true_g2), (est.trace, true_trace)):
            se = got.std() / np.sqrt(got.size)
            assert abs(got.mean() - true) <= 4 * se, (b, got.mean(), true, se)
        # the naive estimates (|G_B|^2 for |G|^2, B times the spread for the trace) are biased: at b = 2 by far
        # more than the standard error, so the test above can tell
        if b == 2:
            assert abs(g2.mean() - true_g2) > 10 * (g2.std() / np.sqrt(g2.size))


def test_noise_scale_and_snr_follow_from_the_two_terms():
    est = estimate(sum_sq_norms=0.5, total_sq=2.0, sentences=4)
    assert est.grad_sq == pytest.approx(4 * (2.0 - 0.5) / 3) and est.trace == pytest.approx(4 * (4 * 0.5 - 2.0) / 3)
    est = estimate(sum_sq_norms=1.0, total_sq=2.0, sentences=4)
    assert est.b_simple == pytest.approx(est.trace / est.grad_sq) and est.snr == pytest.approx(4 / est.b_simple)
    with pytest.raises(ValueError, match="at least two sentences"):
        estimate(1.0, 1.0, 1)


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False, pre_norm=True, positional="learned")])
def test_every_parameter_has_a_layer_type(kw):
    model = Transformer(ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, max_len=32, **kw))
    kinds = {n: group_of(n) for n, _ in model.named_parameters()}
    assert set(kinds.values()) == set(GROUPS)
    per_layer_norms = 2 * (2 * 2 + 3 * 2 + (2 if kw.get("pre_norm") else 0))  # gain and bias of every LayerNorm
    assert sum(k == "layernorm" for k in kinds.values()) == per_layer_norms
    assert sum(k == "attention" for k in kinds.values()) == 8 * 3 * 2  # 4 projections, weight and bias
    assert sum(k == "feed_forward" for k in kinds.values()) == 4 * 4


def _model_and_batch():
    model = Transformer(ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32),
                        seed=1)
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 13, (6, 5)), rng.integers(1, 13, (6, 6))
    src[2, 3:], tgt[4, 2:] = 0, 0
    return model, src, tgt


def test_groups_and_total_add_their_tensors():
    model, src, tgt = _model_and_batch()
    crit = LabelSmoothedCrossEntropy(0.1, 0)
    with PerSentenceGradients(model) as tap:
        crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:])
        model.backward(crit.backward())
    stats = tap.statistics()
    noise = noise_scales(stats)
    for name, st in stats.items():
        s, g2 = float(st.sq_norms.sum()), float((st.total.astype(np.float64) ** 2).sum())
        # a difference of two float32 sums: its error is float32's of the larger term, not of the difference
        assert noise["tensors"][name].grad_sq == pytest.approx(6 * (g2 - s) / 5, abs=1e-5 * 6 * max(g2, s) / 5)
    for group in GROUPS:
        members = [e for n, e in noise["tensors"].items() if group_of(n) == group]
        assert noise["groups"][group].trace == pytest.approx(sum(e.trace for e in members), rel=1e-9)
    assert noise["total"].grad_sq == pytest.approx(sum(e.grad_sq for e in noise["tensors"].values()), rel=1e-9)


def logged_step(model, src, tgt, path):
    """One --log-grads step of GradientStatistics on the batch, at the places the trainer's hooks reach:
    (record, loss)."""
    crit = LabelSmoothedCrossEntropy(0.1, 0)
    stats = GradientStatistics(model, path)
    model.zero_grad()
    stats.begin(1, None)
    stats.before_forward(0, True)
    loss = crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:])
    stats.after_forward(True)
    model.backward(crit.backward())
    stats.before_update(1)
    stats.after_update(1)
    return stats.record, loss


def test_log_grads_records_the_noise_scale_of_the_last_batch(tmp_path):
    model, src, tgt = _model_and_batch()
    crit = LabelSmoothedCrossEntropy(0.1, 0)
    record, loss = logged_step(model, src, tgt, tmp_path / "grad_stats.jsonl")
    assert not [m for m in model.modules() if "backward" in vars(m)]  # the taps are off again
    # the same batch, tapped directly
    model.zero_grad()
    with PerSentenceGradients(model) as tap:
        crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:])
        model.backward(crit.backward())
    direct = noise_scales(tap.statistics())
    logged = json.loads((tmp_path / "grad_stats.jsonl").read_text().splitlines()[-1])["noise"]
    assert logged == record["noise"] and logged["sentences"] == 6
    assert logged["total"]["b_simple"] == pytest.approx(direct["total"].b_simple, rel=1e-6)
    for group in GROUPS:
        assert logged["groups"][group]["trace"] == pytest.approx(direct["groups"][group].trace, rel=1e-6)
    assert float(loss) > 0
    assert plot_noise_scale([record, dict(record, step=2)], tmp_path).name == "noise_scale.png"


def test_a_batch_of_one_sentence_logs_no_noise_scale(tmp_path):
    model, src, tgt = _model_and_batch()
    record, _ = logged_step(model, src[:1], tgt[:1], tmp_path / "grad_stats.jsonl")
    assert "noise" not in record


def test_sentence_gradients_count_their_sentences():
    st = SentenceGradients(np.zeros(5), np.zeros(3), np.zeros(3))
    assert st.sentences == 5
