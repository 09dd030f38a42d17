"""Exercise 3 of 18: GELU's backward (Eq. 2 with GELU for max(0, x)). Level: derive.

GELU, the Gaussian error linear unit (Hendrycks and Gimpel 2016, Section 2), in its exact form: the
activation of the feed-forward network in BERT-style models, transformers' ``gelu`` (Eq. 2 with
``max(0, .)`` replaced). Shapes: any -> same.

        The forward (shown below as gelu_forward) computes y = x * g elementwise, with the gate g a function
        of x alone, and keeps x and g. Your function receives dy = dL/dy (x's shape), x and gate = g (x's shape).
        It returns dx = dL/dx, of x's shape and dy's dtype.

Your part: derive the backward pass on paper from the forward above, then write the body of
gelu_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when graded
and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_gelu.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_gelu.py

When it checks exact, train with it (every GELU numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap GELU=bench/held_out_grading_6/answers/my_gelu.py:GELU
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap GELU=bench/held_out_grading_6/answers/my_gelu.py:GELU
"""

import numpy as np

from numformer.layers.gelu import GELU as NumformerGELU
from numformer.swap import using

EXERCISE = "gelu"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.gelu.normal_cdf:
# def normal_cdf(x):
#     """g = Phi(x) = (1 + erf(x / sqrt 2)) / 2, computed as erfc(-x / sqrt 2) / 2; x's shape and dtype."""
#     return 0.5 * erfc(-SQRT_HALF * x)
#
# numformer.layers.gelu.gelu_forward:
# def gelu_forward(x):
#     """-> (y, g): y = x * g with the gate g = Phi(x), which backward needs too."""
#     g = normal_cdf(x)
#     return x * g, g
#
# numformer.layers.gelu.GELU.forward:
# def forward(self, x):
#     y, gate = gelu_forward(x)
#     self.save_for_backward(x=x, gate=gate)
#     return y
#
# numformer.layers.gelu.GELU.backward:
# def backward(self, dy):
#     x, gate = self.pop_saved("x", "gate")
#     return gelu_backward(dy, x, gate)


def gelu_backward(dy, x, gate):
    """Return dx = dL/dx, of x's shape, from dy (x's shape), the forward's input x and its gate g
    (x's shape)."""
    phi = np.exp(-0.5 * np.square(x)) / np.sqrt(2.0 * np.pi)   # Phi'(x), the normal density
    local = gate - x * phi
    return dy * local


# numformer's GELU, its methods calling your gelu_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
GELU = using(NumformerGELU, gelu_backward=gelu_backward)
