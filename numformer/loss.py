"""Label-smoothed cross-entropy (Section 5.4, eps_ls = 0.1; Szegedy et al. 2016).

Target distribution, as in Szegedy et al. and PyTorch's ``label_smoothing``:
``q = (1 - eps) * onehot(y) + eps / V`` — eps spread uniformly over *all* V classes
(the true class included). (fairseq instead puts eps/(V-1) on each wrong class.)

Closed form per token, with z the logits and lse = log sum exp z:
``loss = lse - (1 - eps) * z_y - eps * mean_k(z_k)``; gradient ``softmax(z) - q``.
No (tokens, V) smoothed one-hot is built. The loss is the mean over non-padding
target tokens (or a sum divided by a given ``normalizer``, for gradient accumulation
over several batches); backward seeds 1/normalizer.

Forward mode (numformer/forward_mode.py), with the logits' tangent ``z_dot`` and the token weights ``w``
(``[not pad] / normalizer``): ``loss_dot = sum_t w_t <softmax(z_t) - q_t, z_dot_t>``, the gradient against
the tangent. The backward's tangent (Pearlmutter's R-operator: q is constant, p = softmax(z) moves):
``dz_dot = p * (z_dot - <p, z_dot>) * w``, the softmax's Jacobian on the tangent.

Shapes: logits (B, T, V) or (N, V); target (B, T) or (N,) ids.
"""
from __future__ import annotations

from .backend import get_array_module
from .kernels import kernel
from .layers.registry import registered
from .layers.softmax import softmax_jvp


def smoothed_cross_entropy(z, y, eps: float, keep_probs: bool = True, overwrite: bool = False):
    """z (N, V) logits, y (N,) ids -> (loss (N,), nll (N,), p (N, V) or None), per token.

    ``lse = log sum_k exp z_k`` (computed as ``max z + log sum exp(z - max z)``);
    ``nll = lse - z_y``; ``loss = (1 - eps) * nll + eps * (lse - mean_k z_k)``;
    ``p = softmax(z)``, kept for backward when ``keep_probs``. ``overwrite``: the caller
    allows z's buffer to be reused for p (a fast kernel does; the plain math need not).
    """
    xp = get_array_module(z)
    zmax = z.max(axis=1, keepdims=True)
    e = xp.exp(z - zmax)
    sumexp = e.sum(axis=1)
    lse = zmax[:, 0] + xp.log(sumexp)
    nll = lse - xp.take_along_axis(z, y[:, None], axis=1)[:, 0]
    loss = (1.0 - eps) * nll + eps * (lse - z.mean(axis=1))
    p = e / sumexp[:, None] if keep_probs else None
    return loss, nll, p


def smoothed_cross_entropy_backward(p, y, eps: float, weight):
    """dL/dz = (p - q) * weight, with q = (1 - eps) onehot(y) + eps / V; weight (N,) per token."""
    xp = get_array_module(p)
    dz = p - eps / p.shape[1]
    dz[xp.arange(p.shape[0]), y] -= 1.0 - eps
    return dz * weight[:, None]


def smoothed_cross_entropy_jvp(p, y, eps: float, weight, z_dot):
    """loss_dot = sum over tokens of weight * <p - q, z_dot> (0-d), z_dot (N, V)."""
    return (smoothed_cross_entropy_backward(p, y, eps, weight) * z_dot).sum()


def smoothed_cross_entropy_backward_jvp(p, weight, z_dot):
    """The tangent of smoothed_cross_entropy_backward: dz_dot = p * (z_dot - <p, z_dot>) * weight (N, V)."""
    return softmax_jvp(z_dot, p) * weight[:, None]


@registered  # the class the trainer builds: numformer.layers.registry
class LabelSmoothedCrossEntropy:
    """Forward returns the smoothed loss (a 0-d array, on the logits' device); backward its gradient."""

    kinks = False  # log-softmax and sums (Module.kinks: the layer contract)

    def __init__(self, smoothing: float = 0.1, pad_id: int = 0):
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
        self.eps = float(smoothing)
        self.pad_id = pad_id
        self.nll_sum = None      # sum of -log p(y) over non-pad tokens (for perplexity)
        self.n_tokens = None     # number of non-pad target tokens (0-d array)
        self._cache = None
        self._z_dot = None       # the logits' tangent, kept by jvp for backward_jvp

    def forward(self, logits, target, normalizer=None, keep_for_backward: bool = True,
                overwrite_logits: bool = False):
        """logits (..., V), target (...) -> sum of the smoothed loss over non-pad tokens / normalizer (0-d array).

        ``normalizer``: divide by this instead of this batch's non-pad token count.
        ``overwrite_logits``: the logits buffer may be reused for the softmax that backward
        needs (saves one (tokens, V) array; the caller's logits are garbage afterwards).
        """
        xp = get_array_module(logits)
        z = logits.reshape(-1, logits.shape[-1])
        y = xp.asarray(target).reshape(-1)  # host ids with device logits are moved (no-op otherwise)
        loss, nll, p = kernel(smoothed_cross_entropy)(z, y, self.eps, keep_for_backward, overwrite_logits)
        keep = (y != self.pad_id).astype(z.dtype)
        n_tokens = (y != self.pad_id).sum()
        norm = xp.maximum(xp.asarray(n_tokens if normalizer is None else normalizer, dtype=z.dtype), 1)
        self.nll_sum = (nll * keep).sum()
        self.n_tokens = n_tokens
        self._z_dot = None  # a new forward has had no jvp
        if keep_for_backward:
            self._cache = (p, y, keep / norm, logits.shape)
        return (loss * keep).sum() / norm

    def backward(self):
        """-> dL/dlogits with the logits' shape: (softmax(z) - q) * [not pad] / normalizer."""
        p, y, weight, shape = self._cache
        self._cache = None
        return kernel(smoothed_cross_entropy_backward)(p, y, self.eps, weight).reshape(shape)

    def jvp(self, logits_dot):
        """The logits' tangent (..., V) -> the loss's (0-d): the directional derivative of the loss. Needs a
        forward with ``keep_for_backward`` (and not ``overwrite_logits``) before it."""
        if self._cache is None:
            raise RuntimeError("LabelSmoothedCrossEntropy.jvp without a forward that kept its softmax before it")
        p, y, weight, shape = self._cache
        z_dot = logits_dot.reshape(-1, shape[-1])
        self._z_dot = z_dot
        return smoothed_cross_entropy_jvp(p, y, self.eps, weight, z_dot)

    def backward_jvp(self):
        """-> (dL/dlogits, its tangent), both with the logits' shape."""
        z_dot, self._z_dot = self._z_dot, None
        if z_dot is None or self._cache is None:
            raise RuntimeError("LabelSmoothedCrossEntropy.backward_jvp without a jvp after the forward before it")
        p, _, weight, shape = self._cache
        dz_dot = smoothed_cross_entropy_backward_jvp(p, weight, z_dot).reshape(shape)  # before the backward: its
        return self.backward(), dz_dot                                                  # fast twin reuses p's buffer


