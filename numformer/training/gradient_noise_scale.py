"""The gradient noise scale and signal-to-noise ratio, per tensor, per layer type and in total.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): with per-example gradients
``x_i`` of mean ``G`` and covariance ``Sigma``, the *simple noise scale* ``B_simple = tr(Sigma) / |G|^2``
is the batch size at which the gradient's noise equals its signal, and so where larger batches stop
paying. A batch gradient of size B has ``E |G_B|^2 = |G|^2 + tr(Sigma) / B``; two batch sizes give
unbiased estimates of both terms (their Appendix A.1):

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

numformer has every sentence's gradient exactly (numformer/training/per_sentence_gradients.py), so the small
"batch" is one sentence and the big one the whole batch. A sentence is the example: its gradient
``g_b`` is a share of the batch gradient ``G = sum_b g_b`` (the loss is divided by the batch's token
count), so the per-example estimate of G is ``x_b = B g_b`` and, averaged over the batch,
``|G_small|^2 = mean_b |x_b|^2 = B sum_b |g_b|^2``, ``|G_big|^2 = |G|^2``; hence, with ``s = sum_b |g_b|^2``:

    |G|^2     ~ B (|G|^2 - s) / (B - 1)
    tr(Sigma) ~ B (B s - |G|^2) / (B - 1)

The signal-to-noise ratio of the batch gradient is ``|G|^2 / (tr(Sigma) / B) = B / B_simple``. Sums of
both terms over the tensors of a group give the group's noise scale (Gray et al. 2024 compare the
layer types' with the total's): attention (every projection of the self- and encoder-decoder
attention), feed-forward, LayerNorm, embedding (the vocabulary matrix, the position tables).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..backend import get_array_module, read_scalars

GROUPS = ("attention", "feed_forward", "layernorm", "embedding")


@dataclass(frozen=True)
class NoiseEstimate:
    """Unbiased ``|G|^2`` and ``tr(Sigma)`` of one tensor or group, from a batch of ``sentences``."""

    grad_sq: float
    trace: float
    sentences: int

    @property
    def b_simple(self) -> float:
        """``tr(Sigma) / |G|^2``; nan when the estimate of ``|G|^2`` is not positive (noise dominates)."""
        return self.trace / self.grad_sq if self.grad_sq > 0 else math.nan

    @property
    def snr(self) -> float:
        """``|G|^2 / (tr(Sigma) / B)``, the batch gradient's signal over its noise; nan when undefined."""
        return self.grad_sq * self.sentences / self.trace if self.trace > 0 else math.nan

    def __add__(self, other: "NoiseEstimate") -> "NoiseEstimate":
        return NoiseEstimate(self.grad_sq + other.grad_sq, self.trace + other.trace, self.sentences)


def estimate(sum_sq_norms: float, total_sq: float, sentences: int) -> NoiseEstimate:
    """The estimate from ``s = sum_b |g_b|^2`` and ``|G|^2 = |sum_b g_b|^2`` over ``sentences`` >= 2."""
    b = int(sentences)
    if b < 2:
        raise ValueError("the noise scale needs at least two sentences in the batch")
    return NoiseEstimate(b * (total_sq - sum_sq_norms) / (b - 1), b * (b * sum_sq_norms - total_sq) / (b - 1), b)


def group_of(name: str) -> str:
    """The layer type of a parameter by its name in numformer's model."""
    if "attn." in name:
        return "attention"
    if ".ffn." in name:
        return "feed_forward"
    if "norm." in name:
        return "layernorm"
    if "embed" in name or "generator" in name or "_pos." in name:
        return "embedding"
    raise ValueError(f"no layer type for the parameter {name}")


def noise_scales(statistics: dict) -> dict:
    """{"tensors": {name: NoiseEstimate}, "groups": {type: NoiseEstimate}, "total": NoiseEstimate} from
    :meth:`PerSentenceGradients.statistics` (reduced on the arrays' device, read in one copy)."""
    names = list(statistics)
    if not names:
        raise ValueError("no per-sentence statistics to estimate the noise scale from")
    xp = get_array_module(statistics[names[0]].sq_norms)  # total is None in the norms-only mode
    sums = []
    for name in names:
        st = statistics[name]
        if st.total is not None:
            total = st.total.reshape(-1)
            sums += [st.sq_norms.sum(), (total * total).sum()]
        else:  # the norms-only mode: |G|^2 read from the gradients
            sums += [st.sq_norms.sum(), st.grad_sq]
    values = read_scalars(xp, *sums)
    tensors = {n: estimate(values[2 * i], values[2 * i + 1], statistics[n].sentences) for i, n in enumerate(names)}
    groups = summed_by(tensors, group_of)
    total = summed_by(tensors, lambda name: "total")["total"]
    return {"tensors": tensors, "groups": {g: groups[g] for g in GROUPS if g in groups}, "total": total}


def summed_by(tensors: dict, key) -> dict:
    """{key(name): the sum of the estimates of the tensors with that key} (both terms add over tensors);
    tensors whose key is None are left out."""
    out = {}
    for name, est in tensors.items():
        k = key(name)
        if k is not None:
            out[k] = out[k] + est if k in out else est
    return out
