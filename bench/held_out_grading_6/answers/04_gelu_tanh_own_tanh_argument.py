"""Exercise 4 of 18: GELUTanh's backward (Eq. 2 with GELUTanh for max(0, x)). Level: derive.

GELU in its tanh form (Hendrycks and Gimpel 2016, Section 2's approximation): the activation of
GPT-2's feed-forward network, transformers' ``gelu_new`` and ``gelu_pytorch_tanh``, PyTorch's
``F.gelu(approximate="tanh")`` (Eq. 2 with ``max(0, .)`` replaced). Shapes: any -> same.

        The forward (shown below as gelu_tanh_forward) computes y = x * g elementwise, with the gate g a function
        of x alone, and keeps x and g. Your function receives dy = dL/dy (x's shape), x and gate = g (x's shape).
        It returns dx = dL/dx, of x's shape and dy's dtype.

Your part: derive the backward pass on paper from the forward above, then write the body of
gelu_tanh_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_gelu_tanh.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_gelu_tanh.py

When it checks exact, train with it (every GELUTanh numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap GELUTanh=bench/held_out_grading_6/answers/my_gelu_tanh.py:GELUTanh
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap GELUTanh=bench/held_out_grading_6/answers/my_gelu_tanh.py:GELUTanh
"""

import numpy as np

from numformer.layers.gelu_tanh import GELUTanh as NumformerGELUTanh
from numformer.swap import using

EXERCISE = "gelu_tanh"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.gelu_tanh.gelu_tanh_forward:
# def gelu_tanh_forward(x):
#     """-> (y, g): y = x * g with the gate g = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
#     g = sigmoid(2 * C * (x + K * x * x * x))
#     return x * g, g
#
# numformer.layers.gelu_tanh.GELUTanh.forward:
# def forward(self, x):
#     y, gate = gelu_tanh_forward(x)
#     self.save_for_backward(x=x, gate=gate)
#     return y
#
# numformer.layers.gelu_tanh.GELUTanh.backward:
# def backward(self, dy):
#     x, gate = self.pop_saved("x", "gate")
#     return gelu_tanh_backward(dy, x, gate)


def gelu_tanh_backward(dy, x, gate):
    """Return dx = dL/dx, of x's shape, from dy (x's shape), the forward's input x and its gate g
    (x's shape)."""
    c = np.sqrt(2.0 / np.pi)
    u = c * (x + 0.044715 * x ** 2)
    t = np.tanh(u)
    du_dx = c * (1.0 + 0.134145 * x * x)
    # y = 0.5 x (1 + tanh u): product rule, tanh' = 1 - tanh^2
    dydx = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx
    return dy * dydx


# numformer's GELUTanh, its methods calling your gelu_tanh_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
GELUTanh = using(NumformerGELUTanh, gelu_tanh_backward=gelu_tanh_backward)
