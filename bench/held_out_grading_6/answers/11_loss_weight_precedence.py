"""Exercise 7 of 18: the backward of the label-smoothed cross-entropy (Section 5.4). Level: derive.

The label-smoothed cross-entropy (Section 5.4: label smoothing of value eps_ls = 0.1; Szegedy et al.
2016). The logits z are flattened into N rows (one per target token) of V classes; y_t is row t's
target id. The smoothed target q_t of row t spreads eps uniformly over all V classes, the true one
included (so its V entries sum to 1):

    q_tk   = (1 - eps) [k = y_t] + eps / V          [k = y_t]: 1 at the target, else 0
    p_t    = softmax(z_t)                           p_tk = exp(z_tk) / sum_m exp(z_tm)
    loss_t = - sum_k q_tk log p_tk
           = lse_t - (1 - eps) z_(t, y_t) - eps * mean_k z_tk,     lse_t = log sum_m exp(z_tm)
    L      = sum_t weight_t * loss_t                weight_t = [y_t is not padding] / normalizer

The normalizer is the number of non-padding target tokens, so that L is the mean loss over them,
unless the caller gave another (gradient accumulation over several batches). Forward computed weight
for you: a padding row has weight 0, and the 1/normalizer is already in it.

Your function receives p = softmax(z) (N, V), kept by forward; y (N,), the target ids (int); eps
(float), the smoothing; and weight (N,). It returns dz = dL/dz (N, V). The (N, V) target q need not
be built. You may overwrite p: nothing else reads it.

Your part: derive the backward pass on paper from the forward above, then write the body of
smoothed_cross_entropy_backward below, replacing its `raise NotImplementedError`. The arrays are
float64 when graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_loss.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_loss.py

When it checks exact, train with it (every LabelSmoothedCrossEntropy numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap LabelSmoothedCrossEntropy=bench/held_out_grading_6/answers/my_loss.py:LabelSmoothedCrossEntropy
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap LabelSmoothedCrossEntropy=bench/held_out_grading_6/answers/my_loss.py:LabelSmoothedCrossEntropy
"""

import numpy as np

from numformer.loss import LabelSmoothedCrossEntropy as NumformerLabelSmoothedCrossEntropy
from numformer.swap import using

EXERCISE = "loss"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.loss.smoothed_cross_entropy:
# def smoothed_cross_entropy(z, y, eps: float, keep_probs: bool = True, overwrite: bool = False):
#     """z (N, V) logits, y (N,) ids -> (loss (N,), nll (N,), p (N, V) or None), per token.
#
#     ``lse = log sum_k exp z_k`` (computed as ``max z + log sum exp(z - max z)``);
#     ``nll = lse - z_y``; ``loss = (1 - eps) * nll + eps * (lse - mean_k z_k)``;
#     ``p = softmax(z)``, kept for backward when ``keep_probs``. ``overwrite``: the caller
#     allows z's buffer to be reused for p (a fast kernel does; the plain math need not).
#     """
#     xp = get_array_module(z)
#     zmax = z.max(axis=1, keepdims=True)
#     e = xp.exp(z - zmax)
#     sumexp = e.sum(axis=1)
#     lse = zmax[:, 0] + xp.log(sumexp)
#     nll = lse - xp.take_along_axis(z, y[:, None], axis=1)[:, 0]
#     loss = (1.0 - eps) * nll + eps * (lse - z.mean(axis=1))
#     p = e / sumexp[:, None] if keep_probs else None
#     return loss, nll, p
#
# numformer.loss.LabelSmoothedCrossEntropy.forward:
# def forward(self, logits, target, normalizer=None, keep_for_backward: bool = True,
#             overwrite_logits: bool = False):
#     """logits (..., V), target (...) -> sum of the smoothed loss over non-pad tokens / normalizer (0-d array).
#
#     ``normalizer``: divide by this instead of this batch's non-pad token count.
#     ``overwrite_logits``: the logits buffer may be reused for the softmax that backward
#     needs (saves one (tokens, V) array; the caller's logits are garbage afterwards).
#     """
#     xp = get_array_module(logits)
#     z = logits.reshape(-1, logits.shape[-1])
#     y = xp.asarray(target).reshape(-1)  # host ids with device logits are moved (no-op otherwise)
#     loss, nll, p = kernel(smoothed_cross_entropy)(z, y, self.eps, keep_for_backward, overwrite_logits)
#     keep = (y != self.pad_id).astype(z.dtype)
#     n_tokens = (y != self.pad_id).sum()
#     norm = xp.maximum(xp.asarray(n_tokens if normalizer is None else normalizer, dtype=z.dtype), 1)
#     self.nll_sum = (nll * keep).sum()
#     self.n_tokens = n_tokens
#     self._z_dot = None  # a new forward has had no jvp
#     if keep_for_backward:
#         self._cache = (p, y, keep / norm, logits.shape)
#     return (loss * keep).sum() / norm
#
# numformer.loss.LabelSmoothedCrossEntropy.backward:
# def backward(self):
#     p, y, weight, shape = self._cache
#     self._cache = None
#     return kernel(smoothed_cross_entropy_backward)(p, y, self.eps, weight).reshape(shape)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def smoothed_cross_entropy_backward(p, y, eps: float, weight):
    """Return dz = dL/dz (N, V), the gradient of the weighted smoothed loss with respect to the
    logits, from p = softmax(z) (N, V), the target ids y (N,), eps and the per-row weight (N,)."""
    V = p.shape[1]
    onehot = np.zeros_like(p)
    onehot[np.arange(len(y)), y] = 1.0
    dz = p - (1 - eps) * onehot - eps / V * weight[:, None]
    return dz


# numformer's LabelSmoothedCrossEntropy, its methods calling your smoothed_cross_entropy_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
LabelSmoothedCrossEntropy = using(NumformerLabelSmoothedCrossEntropy, smoothed_cross_entropy_backward=smoothed_cross_entropy_backward)
