"""Exercise 1 of 18: ReLU's backward (Eq. 2). Level: derive.

The activation of the position-wise feed-forward network (Eq. 2: FFN(x) = max(0, x W1 + b1) W2 +
b2), applied elementwise to an array x of any shape:

    y_i = max(0, x_i)

Forward also keeps positive = [x > 0], a boolean array of x's shape: True where the unit was active.
At x_i = 0 exactly, where max(0, x) has its kink, the derivative is taken as 0 (as PyTorch does;
positive is False there).

Your function receives dy = dL/dy (x's shape) and positive (bool, x's shape); it does not get x. It
returns dx = dL/dx, of x's shape and dy's dtype.

Your part: derive the backward pass on paper from the forward above, then write the body of
relu_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when graded
and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (3 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_relu.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_relu.py

When it checks exact, train with it (every ReLU numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap ReLU=bench/held_out_grading_6/answers/my_relu.py:ReLU
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap ReLU=bench/held_out_grading_6/answers/my_relu.py:ReLU
"""

import numpy as np

from numformer.layers.relu import ReLU as NumformerReLU
from numformer.swap import using

EXERCISE = "relu"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.relu.relu_forward:
# def relu_forward(x):
#     """-> (y, positive): y = max(0, x) and the active set [x > 0] that backward needs."""
#     positive = x > 0
#     return get_array_module(x).maximum(x, 0), positive
#
# numformer.layers.relu.ReLU.forward:
# def forward(self, x):
#     y, positive = kernel(relu_forward)(x)
#     self.save_for_backward(positive=positive)
#     return y
#
# numformer.layers.relu.ReLU.backward:
# def backward(self, dy):
#     return kernel(relu_backward)(dy, self.pop_saved("positive"))
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def relu_backward(dy, positive):
    """Return dx = dL/dx, of x's shape, from dy (x's shape) and the forward's active set positive
    (bool, x's shape)."""
    # the gradient only gets through where the unit let something through
    through = dy > 0
    return dy * through


# numformer's ReLU, its methods calling your relu_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
ReLU = using(NumformerReLU, relu_backward=relu_backward)
