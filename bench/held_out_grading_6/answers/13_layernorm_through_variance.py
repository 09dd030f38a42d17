"""Exercise 8 of 18: LayerNorm's backward (Section 3.1; Ba et al. 2016). Level: derive.

The forward, per row x of d features (the layer flattens the leading axes into n rows):

    mu   = (1/d) sum_j x_j
    var  = (1/d) sum_j (x_j - mu)^2
    r    = 1 / sqrt(var + eps)
    xhat = (x - mu) * r
    y    = gamma * xhat + beta          (elementwise: gamma and beta hold one entry per feature)

Your function receives dy = dL/dy (n, d), the forward's xhat (n, d) and r (n, 1), and gamma (d,). It
returns (dx, dgamma, dbeta): dL/dx (n, d), dL/dgamma (d,) and dL/dbeta (d,). gamma and beta are
shared by every row.

Your part: derive the backward pass on paper from the forward above, then write the body of
layernorm_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_layernorm.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_layernorm.py

When it checks exact, train with it (every LayerNorm numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap LayerNorm=bench/held_out_grading_6/answers/my_layernorm.py:LayerNorm
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap LayerNorm=bench/held_out_grading_6/answers/my_layernorm.py:LayerNorm
"""

import numpy as np

from numformer.layers.layernorm import LayerNorm as NumformerLayerNorm
from numformer.swap import using

EXERCISE = "layernorm"  # what `python -m grad_checks check` grades this file as

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
# numformer.layers.layernorm.LayerNorm.backward:
# def backward(self, dy):
#     xhat, r = self.pop_saved("xhat", "r")
#     dx, dgamma, dbeta = kernel(layernorm_backward)(dy.reshape(-1, self.d), xhat, r, self.weight.data)
#     self.weight.grad += dgamma
#     self.bias.grad += dbeta
#     return dx.reshape(dy.shape)
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def layernorm_backward(dy, xhat, r, gamma):
    """Return (dx, dgamma, dbeta): dL/dx (n, d), dL/dgamma (d,) and dL/dbeta (d,), from dy (n, d),
    xhat (n, d), r (n, 1) and gamma (d,)."""
    n, d = xhat.shape
    dgamma = np.einsum("nd,nd->d", dy, xhat)
    dbeta = dy.sum(0)
    dxhat = dy * gamma
    # xhat = (x - mu) * r with r = (var + eps)^(-1/2); xc = x - mu = xhat / r
    xc = xhat / r
    dvar = np.sum(dxhat * xc, axis=1, keepdims=True) * (-0.5) * r ** 3
    dmu = -r * dxhat.sum(axis=1, keepdims=True) - 2.0 * dvar * xc.mean(axis=1, keepdims=True)
    dx = dxhat * r + dvar * 2.0 * xc / d + dmu / d
    return dx, dgamma, dbeta


# numformer's LayerNorm, its methods calling your layernorm_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
LayerNorm = using(NumformerLayerNorm, layernorm_backward=layernorm_backward)
