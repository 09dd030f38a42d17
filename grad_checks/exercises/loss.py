"""Exercise: the backward of the label-smoothed cross-entropy (Section 5.4)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
from numformer.loss import LabelSmoothedCrossEntropy, smoothed_cross_entropy, smoothed_cross_entropy_backward
from numformer.module import Module

from ..cases import PAD
from ..exercise import Exercise


def _onehot(p, y):
    q = np.zeros_like(p)
    q[np.arange(p.shape[0]), y] = 1.0
    return q


def eps_over_v_minus_1(p, y, eps, weight):
    """eps/(V-1) on each wrong class (fairseq's smoothing): numformer spreads eps/V over all V classes, the true one included."""
    onehot = _onehot(p, y)
    q = (1.0 - eps) * onehot + eps / (p.shape[1] - 1) * (1.0 - onehot)
    return (p - q) * weight[:, None]


def smoothing_forgotten(p, y, eps, weight):
    """The target is the plain one-hot: with label smoothing it is q = (1 - eps) onehot(y) + eps / V."""
    return (p - _onehot(p, y)) * weight[:, None]


def mean_over_all_positions(p, y, eps, weight):
    """Divided by every position, padding included: the loss is the mean over the non-padding tokens (weight holds [not pad] / N)."""
    q = (1.0 - eps) * _onehot(p, y) + eps / p.shape[1]
    return (p - q) / p.shape[0]


def padding_positions_with_gradient(p, y, eps, weight):
    """Padding positions get gradient: the right 1/N, but on every row; a padding row has weight 0."""
    q = (1.0 - eps) * _onehot(p, y) + eps / p.shape[1]
    return (p - q) * weight.max()


class LossHolder(Module):
    """Presents the loss (not a Module: it has no parameters) to the checker."""

    def __init__(self, loss):
        super().__init__()
        self.loss = loss


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    out = []
    for name, eps, shape, lengths, normalizer in [
            ("eps 0.1, logits (3, 5, 13), padding", 0.1, (3, 5, 13), [5, 3, 1], None),
            ("eps 0.3, a target row all padding", 0.3, (3, 4, 9), [4, 0, 2], None),
            ("eps 0.1, normalizer 20 (gradient accumulation)", 0.1, (2, 6, 11), [6, 4], 20)]:
        b, t, v = shape
        tgt = rng.integers(1, v, size=(b, t))
        for row, n in enumerate(lengths):
            tgt[row, n:] = PAD
        m = LossHolder(cls(eps, PAD))
        out.append(GradCase("LabelSmoothedCrossEntropy", name, m, {"logits": 2.0 * rng.standard_normal(shape)},
                            lambda m, i, tgt=tgt, n=normalizer: m.loss.forward(i["logits"], tgt, normalizer=n) * 1.0,
                            lambda m, g: {"logits": m.loss.backward() * g[0]}))
    return out


EXERCISE = Exercise(
    name="loss", title="the backward of the label-smoothed cross-entropy", paper="Section 5.4",
    target=smoothed_cross_entropy_backward, layer=LabelSmoothedCrossEntropy, cases=cases, outputs=("dz",),
    in_place=("p",),
    mistakes=(eps_over_v_minus_1, smoothing_forgotten, mean_over_all_positions, padding_positions_with_gradient),
    show=(smoothed_cross_entropy,), swap="LabelSmoothedCrossEntropy",
    notes="p is softmax(z) (N, V), kept by forward; y (N,) the target ids; weight (N,) is [not padding] / "
          "normalizer for each row (forward computed it: the normalizer is the number of non-padding target tokens "
          "unless the caller gave another). The (N, V) target q need not be built. You may overwrite p: nothing "
          "else reads it.")
