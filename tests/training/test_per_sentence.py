"""Per-sentence gradient statistics (numformer/training/per_sentence_gradients.py) are exact: in float64 the sentences'
gradients add up to the batch gradient (1e-12), sentence i's equals the gradient of a batch holding sentence i
alone, trimmed of the other sentences' padding, with the batch's token count as the normaliser; both also
against torch.func's per-sample gradients (vmap of grad) of the PyTorch mirror, every tensor. The tied matrix's
statistics are of its total per-sentence gradient (source lookup + target lookup + projection). Planted
mistakes fail: the tied matrix's uses counted as separate parameters, the normaliser per sentence. The taps
change nothing of the backward and are gone after the block."""
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.kernels import kernel_mode
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.presets import ModelConfig
from numformer.training.per_sentence_gradients import PerSentenceGradients

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

B, S, T, V, PAD = 4, 6, 5, 13, 0
CONFIGS = {
    "tied post-LN": dict(),
    "untied pre-LN learned positions": dict(tie_embeddings=False, pre_norm=True, positional="learned"),
}


def batch():
    """Source (B, S) and target (B, T + 1) ids with padding; source row 3 holds one token only and row 2 of
    the target is short, so padding differs from sentence to sentence; id 5 repeats within a sentence and
    between its source and target (the tied matrix's rows add up per sentence before they are squared)."""
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, V, (B, S)), rng.integers(1, V, (B, T + 1))
    src[1, 4:], src[3, 1:], tgt[2, 3:] = PAD, PAD, PAD
    src[0, :2], tgt[0, 1] = 5, 5
    return src, tgt


def model_of(name, dtype=np.float64):
    cfg = ModelConfig(vocab_size=V, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32, pad_id=PAD,
                      **CONFIGS[name])
    return Transformer(cfg, seed=1, dtype=dtype), cfg


def run(model, src, tgt, normalizer=None):
    crit = LabelSmoothedCrossEntropy(0.1, PAD)
    crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:], normalizer=normalizer)
    model.backward(crit.backward())


def tapped(model, src, tgt, budget=None):
    model.zero_grad()
    tap = PerSentenceGradients(model) if budget is None else PerSentenceGradients(model, budget=budget)
    with tap:
        run(model, src, tgt)
    return tap.statistics()


def alone(model, src, tgt, normalize_per_sentence=False):
    """Each sentence's gradient from a batch holding it alone, trimmed to its own length; the loss divided by
    the whole batch's token count (or, planted, by the sentence's own)."""
    n_batch = int((tgt[:, 1:] != PAD).sum())
    out = []
    for b in range(B):
        s_len = int((src[b] != PAD).sum())
        t_len = int((tgt[b] != PAD).sum())
        model.zero_grad()
        run(model, src[b:b + 1, :s_len], tgt[b:b + 1, :t_len], None if normalize_per_sentence else n_batch)
        out.append({n: p.grad.copy() for n, p in model.named_parameters()})
    return out


FLOOR = 1e-3  # of the statistic's largest value over the model: the floor of a relative error (as the grad checks)


def relative(a, b, scale=0.0) -> float:
    """max |a - b| over max |b|, or over ``FLOOR * scale`` when that is larger: a gradient that is zero by
    symmetry (a key projection's bias: softmax ignores a shift common to a row's scores) is round-off, and a
    relative error of round-off says nothing."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), FLOOR * scale, 1e-300))


def scale_of(values) -> float:
    return max(float(np.abs(v).max()) for v in values)


def worst_against(stats, per_sentence):
    """(worst relative error of the squared norms, of the sums of squares), over every tensor."""
    sq_true = {n: np.array([(g[n] * g[n]).sum() for g in per_sentence]) for n in stats}
    ss_true = {n: sum(g[n] * g[n] for g in per_sentence) for n in stats}
    sq_scale, ss_scale = scale_of(sq_true.values()), scale_of(ss_true.values())
    sq = max(relative(stats[n].sq_norms, sq_true[n], sq_scale) for n in stats)
    ss = max(relative(stats[n].sum_sq, ss_true[n], ss_scale) for n in stats)
    return sq, ss


def plain_statistics(name):
    """The float64 model of ``name``, the batch and the statistics of one tapped backward (plain kernels)."""
    model, _ = model_of(name)
    src, tgt = batch()
    with kernel_mode("plain"):
        return model, src, tgt, tapped(model, src, tgt)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_sentences_add_up_to_the_batch_gradient(name):
    model, _, _, stats = plain_statistics(name)
    assert set(stats) == {n for n, _ in model.named_parameters()}
    scale = scale_of(p.grad for _, p in model.named_parameters())
    for n, p in model.named_parameters():
        assert stats[n].sentences == B
        assert relative(stats[n].total, p.grad, scale) <= 1e-12, n


@pytest.mark.parametrize("name", CONFIGS)
def test_each_sentence_is_the_gradient_of_a_batch_holding_it_alone(name):
    model, src, tgt, stats = plain_statistics(name)
    with kernel_mode("plain"):
        sq, ss = worst_against(stats, alone(model, src, tgt))
    assert sq <= 1e-12 and ss <= 1e-12, (sq, ss)


def test_planted_mistakes_fail():
    model, _ = model_of("tied post-LN")
    src, tgt = batch()
    with kernel_mode("plain"):
        truth = alone(model, src, tgt)
        # the normaliser per sentence: each sentence's loss divided by its own token count
        sq, ss = worst_against(tapped(model, src, tgt), alone(model, src, tgt, normalize_per_sentence=True))
        assert sq > 1e-3 and ss > 1e-3

        # the tied matrix's three uses counted as separate parameters: no cross terms between them
        class Separate(PerSentenceGradients):
            def _reduce_rows(self, acc):
                acc.dense_at_rows = None
                super()._reduce_rows(acc)

        model.zero_grad()
        with Separate(model) as tap:
            run(model, src, tgt)
        stats = tap.statistics()
    tied = "src_embed.weight"
    assert relative(stats[tied].sq_norms, np.array([(g[tied] ** 2).sum() for g in truth])) > 1e-3
    assert relative(stats[tied].sum_sq, sum(g[tied] ** 2 for g in truth)) > 1e-3
    assert relative(stats[tied].total, model.src_embed.weight.grad) <= 1e-12  # the sum alone cannot tell


def test_chunks_of_one_sentence_give_the_same_statistics():
    model, _ = model_of("tied post-LN")
    src, tgt = batch()
    with kernel_mode("plain"):
        whole, one = tapped(model, src, tgt), tapped(model, src, tgt, budget=1)
    for n in whole:
        for field in ("sq_norms", "sum_sq", "total"):
            np.testing.assert_allclose(getattr(one[n], field), getattr(whole[n], field), rtol=1e-12, atol=1e-300)


def test_accumulated_batches_concatenate_their_sentences():
    model, _ = model_of("tied post-LN")
    src, tgt = batch()
    with kernel_mode("plain"):
        first = tapped(model, src[:2], tgt[:2])
        second = tapped(model, src[2:], tgt[2:])
        model.zero_grad()
        with PerSentenceGradients(model) as tap:
            run(model, src[:2], tgt[:2])
            run(model, src[2:], tgt[2:])
        both = tap.statistics()
    for n in both:
        np.testing.assert_allclose(both[n].sq_norms, np.concatenate([first[n].sq_norms, second[n].sq_norms]),
                                   rtol=1e-12)
        np.testing.assert_allclose(both[n].sum_sq, first[n].sum_sq + second[n].sum_sq, rtol=1e-12, atol=1e-300)


def test_the_taps_change_nothing_and_are_gone_after_the_block():
    model, _ = model_of("tied post-LN", dtype=np.float32)
    src, tgt = batch()
    model.zero_grad()
    run(model, src, tgt)
    plain = {n: p.grad.copy() for n, p in model.named_parameters()}
    stats = tapped(model, src, tgt)  # default (fast) kernels, float32
    scale = scale_of(plain.values())
    for n, p in model.named_parameters():
        assert np.array_equal(p.grad, plain[n]), n  # the backward itself is untouched
        np.testing.assert_allclose(stats[n].total, p.grad, rtol=1e-4, atol=1e-6 * scale)
    assert not [m for m in model.modules() if "backward" in vars(m)]


def test_against_torch_func_per_sample_gradients():
    torch = pytest.importorskip("torch")
    from reference import torch_mirror as tm
    from reference.torch_decode import linear_weight_names

    for name in CONFIGS:
        model, cfg = model_of(name)
        src, tgt = batch()
        with kernel_mode("plain"):
            stats = tapped(model, src, tgt)
        arch = tm.Arch.from_config(cfg)
        linear = linear_weight_names(model)
        mirror = tm.MirrorParams([(n, p.data) for n, p in model.named_parameters()], linear)
        params = {n: t.detach() for n, t in mirror.tensors.items()}
        n_batch = int((tgt[:, 1:] != PAD).sum())

        def loss_of(p, s, t):  # one sentence (its padding kept), divided by the batch's token count
            logits = tm.transformer(p, s[None], t[None, :-1], arch)
            target = t[None, 1:]
            n_real = (target != PAD).sum()
            return tm.label_smoothed_loss(logits, target, arch.label_smoothing, PAD) * n_real / n_batch

        per = torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0, 0))(
            params, torch.as_tensor(src), torch.as_tensor(tgt))
        per = {n: np.swapaxes(g.numpy(), -1, -2) if n in linear else g.numpy()  # torch's (d_out, d_in) back
               for n, g in per.items()}
        sq = {n: (g * g).reshape(B, -1).sum(axis=1) for n, g in per.items()}
        ss = {n: (g * g).sum(axis=0) for n, g in per.items()}
        tot = {n: g.sum(axis=0) for n, g in per.items()}
        for n, st in stats.items():
            assert relative(st.sq_norms, sq[n], scale_of(sq.values())) <= 1e-12, (name, n)
            assert relative(st.sum_sq, ss[n], scale_of(ss.values())) <= 1e-12, (name, n)
            assert relative(st.total, tot[n], scale_of(tot.values())) <= 1e-12, (name, n)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_norms_only_mode_gives_the_same_norms_without_forming_a_summand(name):
    model, src, tgt, stats = plain_statistics(name)
    model.zero_grad()
    with kernel_mode("plain"):
        with PerSentenceGradients(model, elementwise=False) as tap:
            run(model, src, tgt)
    norms = tap.statistics()
    sq_scale = scale_of(st.sq_norms for st in stats.values())
    g2 = {n: float((st.total * st.total).sum()) for n, st in stats.items()}
    for n, st in norms.items():
        assert st.sum_sq is None and st.total is None
        assert relative(st.sq_norms, stats[n].sq_norms, sq_scale) <= 1e-12, n
        assert relative(np.asarray(st.grad_sq), np.asarray(g2[n]), max(g2.values())) <= 1e-12, n


def test_the_norms_only_mode_needs_zero_gradients_to_start():
    model, _ = model_of("tied post-LN")
    src, tgt = batch()
    run(model, src, tgt)  # gradients left in .grad
    with pytest.raises(ValueError, match="zero them before the block"):
        with PerSentenceGradients(model, elementwise=False):
            pass
    assert not [m for m in model.modules() if "backward" in vars(m)]


def test_the_pad_row_rule_holds_per_sentence():
    """pad_row_gradient False (Marian's padding_idx) with decoders starting from pad: the sentences' gradients
    still add up to the batch gradient, whose pad row has the projection's share only; each sentence's squared
    norm is that of the gradient of a batch holding it alone."""
    cfg = ModelConfig(vocab_size=V, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32, pad_id=PAD,
                      activation="silu", logits_bias=True, pad_row_gradient=False)
    model = Transformer(cfg, seed=1, dtype=np.float64)
    model.final_logits_bias[...] = np.random.default_rng(2).standard_normal(V)
    src, tgt = batch()
    tgt_in = np.concatenate([np.full((B, 1), PAD), tgt[:, 1:-1]], axis=1)  # the start is pad

    def backward(rows, normalizer=None):
        crit = LabelSmoothedCrossEntropy(0.1, PAD)
        crit.forward(model(src[rows], tgt_in[rows]), tgt[rows, 1:], normalizer=normalizer)
        model.backward(crit.backward())

    model.zero_grad()
    with kernel_mode("plain"), PerSentenceGradients(model) as tap:
        backward(slice(None))
    stats = tap.statistics()
    scale = scale_of(p.grad for _, p in model.named_parameters())
    for n, p in model.named_parameters():
        assert relative(stats[n].total, p.grad, scale) <= 1e-12, n
    n_batch = int((tgt[:, 1:] != PAD).sum())
    for b in range(B):  # one sentence at a time, the batch's token count as the normaliser (padding kept)
        model.zero_grad()
        with kernel_mode("plain"):
            backward(slice(b, b + 1), n_batch)
        g = model.src_embed.weight.grad
        assert relative(stats["src_embed.weight"].sq_norms[b:b + 1], np.array([(g * g).sum()])) <= 1e-12, b
