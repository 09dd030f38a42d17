"""Exercise: the backward of the label-smoothed cross-entropy (Section 5.4)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
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
    stage="loss",
    name="loss", title="the backward of the label-smoothed cross-entropy", paper="Section 5.4",
    names={"p - eps / p.shape[1]": "p - eps / V", "dz[xp.arange(p.shape[0]), y] -= 1.0 - eps": "p - q"},
    symbols={"V": lambda a: a["p"].shape[1], "N": lambda a: a["p"].shape[0],
             "tokens": lambda a: int((a["weight"] != 0).sum())},
    entry_sets=lambda a, shape: {"padding": (a["weight"] == 0)[:, None]} if len(shape) == 2 else {},
    target=smoothed_cross_entropy_backward, layer=LabelSmoothedCrossEntropy, cases=cases, outputs=("dz",),
    upstream=("weight",), in_place=("p",),
    mistakes=(eps_over_v_minus_1, smoothing_forgotten, mean_over_all_positions, padding_positions_with_gradient),
    show=(smoothed_cross_entropy,), swap="LabelSmoothedCrossEntropy",
    notes="p is softmax(z) (N, V), kept by forward; y (N,) the target ids; weight (N,) is [not padding] / "
          "normalizer for each row (forward computed it: the normalizer is the number of non-padding target tokens "
          "unless the caller gave another). The (N, V) target q need not be built. You may overwrite p: nothing "
          "else reads it.",
    forward="""
        The label-smoothed cross-entropy (Section 5.4: label smoothing of value eps_ls = 0.1; Szegedy et al.
        2016). The logits z are flattened into N rows (one per target token) of V classes; y_t is row t's target
        id. The smoothed target q_t of row t spreads eps uniformly over all V classes, the true one included (so its
        V entries sum to 1):

            q_tk   = (1 - eps) [k = y_t] + eps / V          [k = y_t]: 1 at the target, else 0
            p_t    = softmax(z_t)                           p_tk = exp(z_tk) / sum_m exp(z_tm)
            loss_t = - sum_k q_tk log p_tk
                   = lse_t - (1 - eps) z_(t, y_t) - eps * mean_k z_tk,     lse_t = log sum_m exp(z_tm)
            L      = sum_t weight_t * loss_t                weight_t = [y_t is not padding] / normalizer

        The normalizer is the number of non-padding target tokens, so that L is the mean loss over them, unless
        the caller gave another (gradient accumulation over several batches). Forward computed weight for you: a
        padding row has weight 0, and the 1/normalizer is already in it.

        Your function receives p = softmax(z) (N, V), kept by forward; y (N,), the target ids (int); eps (float),
        the smoothing; and weight (N,). It returns dz = dL/dz (N, V). The (N, V) target q need not be built. You
        may overwrite p: nothing else reads it.""",
    returns="Return dz = dL/dz (N, V), the gradient of the weighted smoothed loss with respect to the logits, from "
            "p = softmax(z) (N, V), the target ids y (N,), eps and the per-row weight (N,).",
    steps=("Rows are independent and L = sum_t weight_t * loss_t, where weight_t does not depend on z: so dL/dz_tk "
           "= weight_t * dloss_t/dz_tk. Work out one row's loss gradient, then scale row t by weight_t. weight_t "
           "is 0 on a padding row (no gradient there) and already holds the 1/normalizer: divide by nothing else.",
           "One row, from the closed form loss = lse - (1 - eps) z_y - eps * mean_k z_k, term by term. lse = log "
           "sum_m exp(z_m) has dlse/dz_k = exp(z_k) / sum_m exp(z_m) = p_k: the softmax you are given. z_y has "
           "derivative [k = y] (1 at the target, 0 elsewhere), and mean_k z_k = (1/V) sum_k z_k has derivative "
           "1/V for every k.",
           "So dloss/dz_k = p_k - (1 - eps) [k = y] - eps / V = p_k - q_k: the probabilities minus the smoothed "
           "target. (The same comes from loss = -sum_k q_k log p_k with log p_k = z_k - lse and sum_k q_k = 1.) "
           "The eps / V is on every class, the true one included: not the plain one-hot (that forgets the "
           "smoothing), and not eps/(V-1) on the wrong classes only.",
           "Whole backward: dz_tk = (p_tk - q_tk) * weight_t. In NumPy, without building q: take p - eps / V, with "
           "V = p.shape[1] (a new array, or in place in p, which is allowed here); subtract 1 - eps at each row's "
           "target with fancy indexing, rows np.arange(N) and columns y (one target per row, so no repeated "
           "index); then multiply by weight[:, None], so that the (N,) weights broadcast over the V columns."))
