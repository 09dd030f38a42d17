"""Exercise 14 of 18: the backward of the residual sub-layer (Section 3.1; Xiong et al. 2020). Level: derive.

The forward: the residual connection around each sublayer (Section 3.1, with dropout on the
sublayer's output, Section 5.4), in one of two forms picked by self.pre_norm. Post-LN, the paper's
form (self.pre_norm False), LayerNorm(x + Dropout(Sublayer(x))), in order:

    s = Sublayer(x)              sublayer(x, *args, **kwargs)    (B, T, d_model)
    z = x + Dropout(s)           self.dropout(s, add=x)
    y = LayerNorm(z)             self.norm

Pre-LN (Xiong et al. 2020, self.pre_norm True), x + Dropout(Sublayer(LayerNorm(x))), in order:

    u = LayerNorm(x)             self.norm
    s = Sublayer(u)              sublayer(u, *args, **kwargs)
    y = x + Dropout(s)           self.dropout(s, add=x)

x, u, s, z and y are all (B, T, d_model). The residual sum is done inside the dropout's call: add=x
makes self.dropout return x + Dropout(s) in one step. The sublayer is multi-head attention or the
feed-forward network (Section 3.3); for encoder-decoder attention *args holds the encoder's output
(memory), which the sublayer also uses; the mask has no gradient.

Your method is Residual.backward(self, dy, sublayer): dy = dL/dy (B, T, d_model), and the same
sublayer forward was given (the forward ran first, in training mode). The children, and what their
backward does: self.norm is a LayerNorm: backward(g), g the gradient of its output, returns the
gradient of its input, and adds dgamma and dbeta into its .grad itself (accumulated). self.dropout:
backward(g), g the gradient of the dropout call's output, returns the gradient of the dropped branch
s only; the gradient of the add= input is not part of what it returns (with dropout off, Dropout(s)
= s and its backward returns g as it is). sublayer.backward(g), g the gradient of the sublayer's
output (B, T, d_model), returns the gradient of its first input, or, for encoder-decoder attention,
the tuple (d_input, d_memory), and adds its parameters' gradients itself. Each child's backward uses
what its forward cached, once: call each exactly once. Return dx = dL/dx (B, T, d_model), or the
tuple (dx, d_memory) when the sublayer's backward returned one.

Your part: derive the backward pass on paper from the forward above, then write the body of
Residual.backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_residual.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_residual.py

When it checks exact, train with it (every Residual numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap Residual=bench/held_out_grading_6/answers/my_residual.py:Residual
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap Residual=bench/held_out_grading_6/answers/my_residual.py:Residual
"""

import numpy as np

from numformer.layers.sublayer import Residual as NumformerResidual

EXERCISE = "residual"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.sublayer.Residual.forward:
# def forward(self, x, sublayer, *args, **kwargs):
#     """x (B, T, d_model); ``sublayer(x_in, *args, **kwargs)`` returns (B, T, d_model)."""
#     if self.pre_norm:
#         y = self.dropout(sublayer(self.norm(x), *args, **kwargs), add=x)          # x + Dropout(Sublayer(LN(x)))
#     else:
#         y = self.norm(self.dropout(sublayer(x, *args, **kwargs), add=x))          # LN(x + Dropout(Sublayer(x)))
#     return y


class Residual(NumformerResidual):
    """numformer's Residual (its __init__, forward and children), with your backward."""

    def backward(self, dy, sublayer):
        """Return dL/dx (B, T, d_model), from dy = dL/dy (B, T, d_model), in either form
        (self.pre_norm); or (dL/dx, dL/dmemory) when the sublayer's backward returns (d_input,
        d_memory)."""
        grad = dy
        if not self.pre_norm:
            grad = self.norm.backward(grad)
        through = sublayer.backward(grad)
        if isinstance(through, tuple):
            through, *others = through
        else:
            others = []
        if self.pre_norm:
            through = self.norm.backward(through)
        grad = grad + through
        return (grad, *others) if others else grad
