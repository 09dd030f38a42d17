"""Exercise 2 of 18: SiLU's backward (Eq. 2, Marian's swish). Level: derive.

The activation of the feed-forward network in Marian's translation models (the opus-mt family): Eq.
2, FFN(x) = act(x W1 + b1) W2 + b2, with SiLU ("swish") in place of the paper's max(0, x), applied
elementwise to an array x of any shape:

    s_i = sigmoid(x_i) = 1 / (1 + exp(-x_i))
    y_i = x_i * s_i

Forward keeps x and s (the sigmoid is computed without overflow: see sigmoid below). Unlike ReLU,
SiLU is smooth everywhere: no kink, nothing is switched off.

Your function receives dy = dL/dy (x's shape), x and s (x's shape). It returns dx = dL/dx, of x's
shape and dy's dtype.

Your part: derive the backward pass on paper from the forward above, then write the body of
silu_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when graded
and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_silu.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_silu.py

When it checks exact, train with it (every SiLU numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap SiLU=bench/held_out_grading_6/answers/my_silu.py:SiLU
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap SiLU=bench/held_out_grading_6/answers/my_silu.py:SiLU
"""

import numpy as np

from numformer.layers.silu import SiLU as NumformerSiLU
from numformer.swap import using

EXERCISE = "silu"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.silu.sigmoid:
# def sigmoid(x):
#     """s = 1 / (1 + exp(-x)), as 1 / (1 + e) where x >= 0 and e / (1 + e) where x < 0, with e = exp(-|x|) <= 1
#     (no overflow in float32 or float64); x's shape and dtype."""
#     xp = get_array_module(x)
#     e = xp.exp(-xp.abs(x))
#     r = 1 / (1 + e)
#     return xp.where(x >= 0, r, e * r)
#
# numformer.layers.silu.silu_forward:
# def silu_forward(x):
#     """-> (y, s): y = x * s with s = sigmoid(x), which backward needs too."""
#     s = sigmoid(x)
#     return x * s, s
#
# numformer.layers.silu.SiLU.forward:
# def forward(self, x):
#     y, s = silu_forward(x)
#     self.save_for_backward(x=x, s=s)
#     return y
#
# numformer.layers.silu.SiLU.backward:
# def backward(self, dy):
#     x, s = self.pop_saved("x", "s")
#     return silu_backward(dy, x, s)


def silu_backward(dy, x, s):
    """Return dx = dL/dx, of x's shape, from dy (x's shape), the forward's input x and s =
    sigmoid(x) (x's shape)."""
    sig_prime = s * (1.0 - s)
    dx = dy * s + x * sig_prime
    return dx


# numformer's SiLU, its methods calling your silu_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
SiLU = using(NumformerSiLU, silu_backward=silu_backward)
