"""Exercise 17 of 18: LayerNorm's JVP (forward mode) (Section 3.1; Ba et al. 2016). Level: derive.

Forward mode carries a tangent, a direction of change, through the forward: when x moves along x_dot
and the parameters along gamma_dot and beta_dot, how fast does every output move? The forward, per
row x of d features (the layer flattens the leading axes into n rows):

    mu   = (1/d) sum_j x_j
    var  = (1/d) sum_j (x_j - mu)^2
    r    = 1 / sqrt(var + eps)
    xhat = (x - mu) * r
    y    = gamma * xhat + beta          (elementwise: gamma and beta hold one entry per feature)

Your function receives x_dot (n, d), the forward's xhat (n, d) and r (n, 1), gamma (d,) and the
tangents gamma_dot and beta_dot (d,). It returns (y_dot, xhat_dot, r_dot): the tangents of y (n, d),
xhat (n, d) and r (n, 1), the directional derivatives d/ds of each at x + s x_dot, gamma + s
gamma_dot, beta + s beta_dot (the layer keeps xhat_dot and r_dot for the tangent of its backward).

Your part: derive the backward pass on paper from the forward above, then write the body of
layernorm_jvp below, replacing its `raise NotImplementedError`. The arrays are float64 when graded
and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_layernorm_jvp.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_layernorm_jvp.py
"""

import numpy as np

from numformer.layers.layernorm import LayerNorm as NumformerLayerNorm
from numformer.swap import using

EXERCISE = "layernorm_jvp"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.layernorm.layernorm_forward:
# def layernorm_forward(x, gamma, beta, eps: float):
#     """x (n, d) -> (y, xhat, r): y = xhat * gamma + beta, xhat = (x - mu) * r, r (n, 1)."""
#     xp = get_array_module(x)
#     mu = x.mean(axis=-1, keepdims=True)
#     var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
#     r = 1.0 / xp.sqrt(var + eps)
#     xhat = (x - mu) * r
#     return xhat * gamma + beta, xhat, r
#
# numformer.layers.layernorm.LayerNorm.forward:
# def forward(self, x):
#     """x (..., d) -> y (..., d)."""
#     y, xhat, r = kernel(layernorm_forward)(x.reshape(-1, self.d), self.weight.data, self.bias.data, self.eps)
#     self.save_for_backward(xhat=xhat, r=r)
#     return y.reshape(x.shape)
#
# numformer.layers.layernorm.LayerNorm.jvp:
# def jvp(self, x_dot):
#     xhat, r = self.peek_saved("xhat", "r")
#     y_dot, xhat_dot, r_dot = layernorm_jvp(x_dot.reshape(-1, self.d), xhat, r, self.weight.data,
#                                            self.weight.nonzero_tangent, self.bias.nonzero_tangent)
#     self.save_tangents(xhat=xhat_dot, r=r_dot)
#     return y_dot.reshape(x_dot.shape)
#
# numformer.layers.layernorm.LayerNorm.backward_jvp:
# def backward_jvp(self, dy, dy_dot):
#     (xhat, r), (xhat_dot, r_dot) = self.peek_saved("xhat", "r"), self.pop_tangents("xhat", "r")
#     wanted = self.weight.wants_grad_tangent or self.bias.wants_grad_tangent
#     dx_dot, dgamma_dot, dbeta_dot = layernorm_backward_jvp(dy.reshape(-1, self.d), dy_dot.reshape(-1, self.d),
#                                                            xhat, r, self.weight.data, xhat_dot, r_dot,
#                                                            self.weight.nonzero_tangent, wanted)
#     if wanted:
#         self.weight.grad_tangent += dgamma_dot
#         self.bias.grad_tangent += dbeta_dot
#     return self.backward(dy), dx_dot.reshape(dy.shape)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def layernorm_jvp(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
    """Return (y_dot, xhat_dot, r_dot): the tangents of y (n, d), xhat (n, d) and r (n, 1), from
    x_dot (n, d), xhat (n, d), r (n, 1), gamma, gamma_dot and beta_dot (d,)."""
    mu_dot = x_dot.mean(axis=-1, keepdims=True)
    xc = xhat / r                                   # x - mu
    var_dot = 2.0 * (xc * (x_dot - mu_dot)).mean(axis=-1, keepdims=True)
    r_dot = -0.5 * r ** 2 * var_dot
    xhat_dot = (x_dot - mu_dot) * r + xc * r_dot
    y_dot = gamma * xhat_dot
    if gamma_dot is not None:
        y_dot = y_dot + gamma_dot * xhat
    if beta_dot is not None:
        y_dot = y_dot + beta_dot
    return y_dot, xhat_dot, r_dot


# numformer's LayerNorm, its methods calling your layernorm_jvp (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
LayerNorm = using(NumformerLayerNorm, layernorm_jvp=layernorm_jvp)
