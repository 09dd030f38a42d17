"""Exercise 18 of 18: the tangent of LayerNorm's backward (the R-operator) (Section 3.1; Pearlmutter 1994). Level: derive.

The tangent of a backward: run the backward, and beside each of its lines the tangent of that line,
the derivative d/ds when the forward's point moves along the tangents (x along x_dot, gamma along
gamma_dot) and the upstream gradient dy along dy_dot. When dy is the loss's gradient, the tangents
of the parameters' gradients are the Hessian-vector product H v (Pearlmutter 1994). The backward you
differentiate is shown below as layernorm_backward; with g = dxhat = dy * gamma (n, d) and m =
mean(g * xhat) over the row:

    dgamma = sum over rows of dy * xhat
    dbeta  = sum over rows of dy
    dx     = r * (g - mean(g) - xhat * m)

Your function receives dy and dy_dot (n, d), the forward's xhat (n, d) and r (n, 1), gamma (d,),
what the layer's jvp computed, xhat_dot (n, d) and r_dot (n, 1), and gamma_dot (d,). It returns
(dx_dot, dgamma_dot, dbeta_dot), the tangents of dx (n, d), dgamma (d,) and dbeta (d,).

Your part: derive the backward pass on paper from the forward above, then write the body of
layernorm_backward_jvp below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_layernorm_rop.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_layernorm_rop.py
"""

import numpy as np

from numformer.layers.layernorm import LayerNorm as NumformerLayerNorm
from numformer.swap import using

EXERCISE = "layernorm_rop"  # what `python -m grad_checks check` grades this file as

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
# numformer.layers.layernorm.layernorm_backward:
# def layernorm_backward(dy, xhat, r, gamma):
#     """dy (n, d) -> (dx, dgamma, dbeta)."""
#     dgamma = (dy * xhat).sum(axis=0)
#     dbeta = dy.sum(axis=0)
#     dxhat = dy * gamma
#     dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
#     return dx, dgamma, dbeta
#
# numformer.layers.layernorm.layernorm_jvp:
# def layernorm_jvp(x_dot, xhat, r, gamma, gamma_dot, beta_dot):
#     """x_dot (n, d) -> (y_dot, xhat_dot, r_dot), the tangents of y, xhat (n, d) and r (n, 1); gamma_dot, beta_dot
#     (d,) None where zero."""
#     r_dot = -r * r * (xhat * x_dot).mean(axis=-1, keepdims=True)
#     xhat_dot = r * (x_dot - x_dot.mean(axis=-1, keepdims=True) - xhat * (xhat * x_dot).mean(axis=-1, keepdims=True))
#     y_dot = xhat_dot * gamma
#     if gamma_dot is not None:
#         y_dot = y_dot + xhat * gamma_dot
#     return (y_dot if beta_dot is None else y_dot + beta_dot), xhat_dot, r_dot
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


def layernorm_backward_jvp(dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters: bool = True):
    """Return (dx_dot, dgamma_dot, dbeta_dot): the tangents of dx (n, d), dgamma (d,) and dbeta
    (d,), from dy, dy_dot (n, d), xhat (n, d), r (n, 1), gamma (d,), xhat_dot (n, d), r_dot (n,
    1), gamma_dot (d,)."""
    def mean(a):
        return a.mean(axis=-1, keepdims=True)

    g = dy * gamma
    g_dot = dy_dot * gamma if gamma_dot is None else dy_dot * gamma + dy * gamma_dot
    m, m_dot = mean(g * xhat), mean(g_dot * xhat) + mean(g * xhat_dot)
    inner = g - mean(g) - xhat * m                    # dx = r * inner
    inner_dot = g_dot - mean(g_dot) - (xhat_dot * m + xhat * m_dot)
    dx_dot = r_dot * inner + r * inner_dot
    if not parameters:
        return dx_dot, None, None
    dgamma_dot = np.einsum("nd,nd->d", dy_dot, xhat) + np.einsum("nd,nd->d", dy, xhat_dot)
    return dx_dot, dgamma_dot, dy_dot.sum(axis=0)


# numformer's LayerNorm, its methods calling your layernorm_backward_jvp (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
LayerNorm = using(NumformerLayerNorm, layernorm_backward_jvp=layernorm_backward_jvp)
