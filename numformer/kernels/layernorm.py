"""Fast LayerNorm forward and backward on the host, the same inputs and outputs as
:func:`numformer.layers.layernorm.layernorm_forward` / ``layernorm_backward``.

Row blocks of about ``LN_BLOCK`` elements (cache-resident across the several passes),
spread over the host threads; row means as GEMVs with a ``1/d`` vector (about 3x faster
than ``.mean(axis=-1)`` here); three buffers reused inside each block instead of a new
temporary per operation; the column sums of backward as GEMVs with a ones vector, one
partial per block, summed at the end.
"""
from __future__ import annotations

import numpy as np

from .twins import on_host, replaces
from .host.threads import parallel_rows

LN_BLOCK = 1 << 16  # elements per row block


@replaces("numformer.layers.layernorm.layernorm_forward", when=on_host)
def layernorm_forward_fast(x, gamma, beta, eps: float):
    n, d = x.shape
    xhat, y = np.empty_like(x), np.empty_like(x)
    r = np.empty((n, 1), dtype=x.dtype)
    inv_d = np.full(d, 1.0 / d, dtype=x.dtype)

    def block(xb, hb, yb, rb):
        mean = (xb @ inv_d)[:, None]
        np.subtract(xb, mean, out=hb)
        np.multiply(hb, hb, out=yb)                   # yb: scratch for the squares
        var = (yb @ inv_d)[:, None]
        var += eps
        np.sqrt(var, out=var)
        np.divide(1.0, var, out=rb)
        hb *= rb
        np.multiply(hb, gamma, out=yb)
        yb += beta

    parallel_rows(block, x, xhat, y, r, chunk_elements=LN_BLOCK)
    return y, xhat, r


@replaces("numformer.layers.layernorm.layernorm_backward", when=on_host)
def layernorm_backward_fast(dy, xhat, r, gamma):
    d = dy.shape[1]
    dx = np.empty_like(dy)
    inv_d = np.full(d, 1.0 / d, dtype=dy.dtype)

    def block(dyb, hb, rb, dxb):
        ones = np.ones(dyb.shape[0], dtype=dyb.dtype)
        np.multiply(dyb, hb, out=dxb)                 # dxb: scratch for dy * xhat
        dgamma = ones @ dxb
        dbeta = ones @ dyb
        np.multiply(dyb, gamma, out=dxb)              # dxhat
        mean_dxhat = (dxb @ inv_d)[:, None]
        t = dxb * hb
        mean_dxhat_xhat = (t @ inv_d)[:, None]
        np.multiply(hb, mean_dxhat_xhat, out=t)
        dxb -= mean_dxhat
        dxb -= t
        dxb *= rb
        return dgamma, dbeta

    parts = parallel_rows(block, dy, xhat, r, dx, chunk_elements=LN_BLOCK)
    return dx, sum(g for g, _ in parts), sum(b for _, b in parts)
