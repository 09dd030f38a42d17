"""Label-smoothed cross-entropy (Section 5.4, eps_ls = 0.1; Szegedy et al. 2016).

Target distribution, as in Szegedy et al. and PyTorch's ``label_smoothing``:
``q = (1 - eps) * onehot(y) + eps / V`` — eps spread uniformly over *all* V classes
(the true class included). (fairseq instead puts eps/(V-1) on each wrong class.)

Closed form per token, with z the logits and lse = log sum exp z:
``loss = lse - (1 - eps) * z_y - eps * mean_k(z_k)``; gradient ``softmax(z) - q``.
No (tokens, V) smoothed one-hot is built. The loss is the mean over non-padding
target tokens (or a sum divided by a given ``normalizer``, for gradient accumulation
over several batches); backward seeds 1/normalizer.

Shapes: logits (B, T, V) or (N, V); target (B, T) or (N,) ids.
"""
from __future__ import annotations

from .backend import get_array_module


class LabelSmoothedCrossEntropy:
    """Forward returns the smoothed loss (a 0-d array, on the logits' device); backward its gradient."""

    def __init__(self, smoothing: float = 0.1, pad_id: int = 0):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
        self.eps = float(smoothing)
        self.pad_id = pad_id
        self.nll_sum = None      # sum of -log p(y) over non-pad tokens (for perplexity)
        self.n_tokens = None     # number of non-pad target tokens (0-d array)
        self._cache = None

    def forward(self, logits, target, normalizer=None, keep_for_backward: bool = True):
        """logits (..., V), target (...) -> mean smoothed loss over non-pad tokens (0-d array).

        ``normalizer``: divide the summed loss by this instead of this batch's token count.
        """
        xp = get_array_module(logits)
        v = logits.shape[-1]
        z = logits.reshape(-1, v)
        y = target.reshape(-1)
        keep = y != self.pad_id
        n_tokens = keep.sum()
        zmax = z.max(axis=1, keepdims=True)
        e = z - zmax
        xp.exp(e, out=e)
        sumexp = e.sum(axis=1, keepdims=True)
        lse = (zmax + xp.log(sumexp))[:, 0]
        z_y = xp.take_along_axis(z, y[:, None], axis=1)[:, 0]
        nll = lse - z_y
        smooth = lse - z.mean(axis=1)
        per_token = (1.0 - self.eps) * nll + self.eps * smooth
        keep_f = keep.astype(z.dtype)
        norm = n_tokens if normalizer is None else normalizer
        norm_arr = xp.maximum(xp.asarray(norm, dtype=z.dtype), 1)
        loss = (per_token * keep_f).sum() / norm_arr
        self.nll_sum = (nll * keep_f).sum()
        self.n_tokens = n_tokens
        if keep_for_backward:
            e /= sumexp  # e is now softmax(z)
            self._cache = (e, y, keep_f, norm_arr, logits.shape)
        return loss

    def backward(self):
        """-> dL/dlogits with the logits' shape: (softmax(z) - q) * [not pad] / normalizer.

        Reuses the cached softmax buffer in place (one pass, no extra (N, V) array).
        """
        xp = get_array_module(self._cache[0])
        p, y, keep_f, norm_arr, shape = self._cache
        self._cache = None
        v = p.shape[1]
        rows = xp.arange(p.shape[0])
        p[rows, y] -= 1.0 - self.eps
        if self.eps:
            p -= self.eps / v
        p *= (keep_f / norm_arr)[:, None]
        return p.reshape(shape)
