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

from .backend import get_array_module, parallel_rows

LOSS_BLOCK = 1 << 17  # elements per block of the blocked passes over the logits (about L2-sized)


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

    def forward(self, logits, target, normalizer=None, keep_for_backward: bool = True,
                overwrite_logits: bool = False):
        """logits (..., V), target (...) -> mean smoothed loss over non-pad tokens (0-d array).

        ``normalizer``: divide the summed loss by this instead of this batch's token count.
        ``overwrite_logits``: reuse the logits buffer for the softmax that backward needs
        (saves one (tokens, V) array; the caller's logits are garbage afterwards).

        One blocked pass over the logits: per block of rows (cache-sized, spread over
        the host threads of :func:`~numformer.backend.parallel_rows`) the row max, the
        row sum, ``exp(z - max)`` and its row sum.
        """
        xp = get_array_module(logits)
        v = logits.shape[-1]
        z = logits.reshape(-1, v)
        y = xp.asarray(target).reshape(-1)  # host ids with device logits are moved (no-op otherwise)
        n = z.shape[0]
        keep = y != self.pad_id
        n_tokens = keep.sum()
        z_y = xp.take_along_axis(z, y[:, None], axis=1)[:, 0]
        zmax = xp.empty(n, dtype=z.dtype)
        zsum = xp.empty(n, dtype=z.dtype)
        sumexp = xp.empty(n, dtype=z.dtype)
        if keep_for_backward:
            e = z if overwrite_logits else xp.empty_like(z)

            def block(zb, eb, mb, sb, seb):
                xp.max(zb, axis=1, out=mb)
                xp.sum(zb, axis=1, out=sb)
                xp.subtract(zb, mb[:, None], out=eb)
                xp.exp(eb, out=eb)
                xp.sum(eb, axis=1, out=seb)

            parallel_rows(block, z, e, zmax, zsum, sumexp, chunk_elements=LOSS_BLOCK)
        else:
            e = None

            def block(zb, mb, sb, seb):
                xp.max(zb, axis=1, out=mb)
                xp.sum(zb, axis=1, out=sb)
                eb = zb - mb[:, None]
                xp.exp(eb, out=eb)
                xp.sum(eb, axis=1, out=seb)

            parallel_rows(block, z, zmax, zsum, sumexp, chunk_elements=LOSS_BLOCK)
        lse = zmax + xp.log(sumexp)
        nll = lse - z_y
        smooth = lse - zsum / v
        per_token = (1.0 - self.eps) * nll + self.eps * smooth
        keep_f = keep.astype(z.dtype)
        norm = n_tokens if normalizer is None else normalizer
        norm_arr = xp.maximum(xp.asarray(norm, dtype=z.dtype), 1)
        loss = (per_token * keep_f).sum() / norm_arr
        self.nll_sum = (nll * keep_f).sum()
        self.n_tokens = n_tokens
        if keep_for_backward:
            self._cache = (e, sumexp, y, keep_f, norm_arr, logits.shape)
        return loss

    def backward(self):
        """-> dL/dlogits with the logits' shape: (softmax(z) - q) * [not pad] / normalizer.

        Turns the cached ``exp(z - max)`` buffer into the gradient in place (one
        blocked pass: scale by ``1/(sumexp * normalizer)``, shift by ``eps/V``), then
        subtracts ``1 - eps`` at the targets: no extra (N, V) array.
        """
        e, sumexp, y, keep_f, norm_arr, shape = self._cache
        xp = get_array_module(e)
        self._cache = None
        v = e.shape[1]
        c = keep_f / norm_arr             # per-row weight: 1/normalizer, 0 at padding
        scale = c / sumexp
        shift = c * (self.eps / v)

        def block(pb, scb, shb):
            pb *= scb[:, None]
            if self.eps:
                pb -= shb[:, None]

        parallel_rows(block, e, scale, shift, chunk_elements=LOSS_BLOCK)
        rows = xp.arange(e.shape[0])
        e[rows, y] -= (1.0 - self.eps) * c
        return e.reshape(shape)
