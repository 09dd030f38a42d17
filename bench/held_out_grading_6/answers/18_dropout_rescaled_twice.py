"""Exercise 9 of 18: dropout's backward (Section 5.4). Level: derive.

Inverted dropout (Section 5.4: on the output of every sub-layer, before it is added to the sub-layer
input, and on the sums of the embeddings and the positional encodings; P_drop = 0.1). In training
each element is kept with probability 1 - p and the kept ones are scaled by 1 / (1 - p), so that the
expectation is unchanged and evaluation is the identity:

    m_i = [u_i >= p] / (1 - p)          u_i uniform in [0, 1), one per element
    y_i = x_i * m_i                     elementwise, x of any shape

Forward draws the mask m once (dropout_mask) and keeps it: m has x's shape and dtype, and holds
1/(1-p) where the element was kept and 0 where it was dropped. It is a constant of the forward:
nothing is drawn again in backward (the checks replay one mask). When dropout ends a sub-layer,
forward also adds the residual (y = x * m + add, Section 3.1); that path is not your function's
business: it returns the gradient with respect to x only.

Your function receives dy = dL/dy (x's shape) and that mask m (x's shape). It returns dx = dL/dx, of
x's shape.

Your part: derive the backward pass on paper from the forward above, then write the body of
dropout_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (3 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_dropout.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_dropout.py

When it checks exact, train with it (every Dropout numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap Dropout=bench/held_out_grading_6/answers/my_dropout.py:Dropout
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap Dropout=bench/held_out_grading_6/answers/my_dropout.py:Dropout
"""

import numpy as np

from numformer.layers.dropout import Dropout as NumformerDropout
from numformer.swap import using

EXERCISE = "dropout"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.dropout.dropout_mask:
# def dropout_mask(rng, shape, p: float, dtype):
#     """The mask ``m``: ``1/(1 - p')`` where kept, 0 where dropped.
#
#     ``u_i`` is 16 random bits: an element is dropped when its bits are below ``t = round(p * 2^16)``,
#     so ``p' = t / 2^16`` (0.1 -> 0.100006) and the scale uses ``p'``: the expectation is exact.
#     ``m_i = [u_i >= t] * 2^16 / (2^16 - t)``, in ``dtype``. Where the bits come from (element ``i`` of
#     the ``n`` in C order):
#
#     * CPU (``rng.kind == "pcg64"``): those of one ``random_raw(ceil(n / 4))`` call, four 16-bit
#       elements per 64-bit word, low half first.
#     * GPU (``rng.kind == "philox"``; a CPU generator made with ``generator="philox"`` draws the same):
#       ``u_i`` is the 16-bit half ``i mod 8`` (low half first) of the four 32-bit words
#       ``Philox4x32-10(key = (seed mod 2^32, seed >> 32), counter = (c mod 2^32, c >> 32, 0, 0))``,
#       ``c = offset + i // 8`` (mod 2^64), with ``[seed, offset]`` the generator's state on the device
#       (``rng.counter``); the draw then moves ``offset`` by ``ceil(n / 8)`` on the device
#       (:mod:`numformer.counter_rng`). The fused kernel (numformer/kernels/dropout.py) makes these bits.
#     """
#     if rng.kind == "pcg64":
#         n = int(np.prod(shape, dtype=np.int64))
#         threshold = int(round(p * 65536))
#         bits = rng.generator.bit_generator.random_raw(-(-n // 4)).view(np.uint16)[:n]
#         keep = bits >= threshold
#         return (keep * np.asarray(65536.0 / (65536 - threshold), dtype=dtype)).reshape(shape)
#     threshold = int(round(p * 65536))
#     keep = rng.stream16(shape) >= threshold
#     scale = np.dtype(dtype).type(65536.0 / (65536 - threshold))  # a scalar of the dtype: no copy to the device
#     return keep.astype(dtype) * scale
#
# numformer.layers.dropout.dropout_forward:
# def dropout_forward(x, rng, p: float, add=None):
#     """-> (y, m): y = x * m (+ add), with m = dropout_mask(...).
#
#     ``add`` (x's shape) is the residual connection of Section 3.1 when dropout is the last
#     step of a sub-layer: ``x + Dropout(Sublayer(x))``.
#     """
#     mask = dropout_mask(rng, x.shape, p, x.dtype)
#     y = x * mask
#     if add is not None:
#         y = y + add
#     return y, mask
#
# numformer.layers.dropout.Dropout.forward:
# def forward(self, x, add=None):
#     """x (any shape) -> dropout(x) (+ ``add``, an array of x's shape: the residual path)."""
#     if not self.active():
#         self.save_for_backward(mask=None)
#         return x if add is None else x + add
#     if self.rng is None:
#         raise ValueError("Dropout with p > 0 needs a RandomState (rng=...)")
#     y, mask = kernel(dropout_forward)(x, self.rng, self.p, add)
#     self.save_for_backward(mask=mask)
#     return y
#
# numformer.layers.dropout.Dropout.backward:
# def backward(self, dy):
#     mask = self.pop_saved("mask")
#     return dy if mask is None else dropout_backward(dy, mask)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def dropout_backward(dy, mask):
    """Return dx = dL/dx, of x's shape, from dy (x's shape) and the forward's mask m (x's shape:
    1/(1-p) where kept, 0 where dropped)."""
    kept = mask != 0
    rate = 1.0 - kept.mean()           # the p the forward used
    return dy * mask / (1.0 - rate)


# numformer's Dropout, its methods calling your dropout_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
Dropout = using(NumformerDropout, dropout_backward=dropout_backward)
