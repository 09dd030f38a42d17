"""Exercise: the backward of the residual connection around a sub-layer (Section 3.1), post- and pre-LN."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.gradcheck import GradCase
from numformer.layers import FeedForward, MultiHeadAttention
from numformer.layers.sublayer import Residual

from ..cases import B, D, DFF, HEADS, S, T, Holder, _replay, padded_batch
from ..exercise import Exercise, named_gradients


def _sub(sublayer, g):
    got = sublayer.backward(g)
    return (got[0], got[1:]) if isinstance(got, tuple) else (got, ())


def skip_path_dropped(self, dy, sublayer):
    """The skip path's gradient is dropped: y = x + Sublayer(x) (inside or around the norm), so dx gets dz as well."""
    dz = dy if self.pre_norm else self.norm.backward(dy)
    d_sub, extra = _sub(sublayer, self.dropout.backward(dz))
    dx = self.norm.backward(d_sub) if self.pre_norm else d_sub
    return (dx, *extra) if extra else dx


def skip_path_around_the_norm(self, dy, sublayer):
    """Post-LN: the skip path's gradient bypasses the LayerNorm: y = LN(x + ...), so both paths go through LN's backward."""
    dz = dy if self.pre_norm else self.norm.backward(dy)
    d_sub, extra = _sub(sublayer, self.dropout.backward(dz))
    dx = (dy if not self.pre_norm else dz) + (self.norm.backward(d_sub) if self.pre_norm else d_sub)
    return (dx, *extra) if extra else dx


def norm_on_the_skip_path(self, dy, sublayer):
    """Pre-LN: the LayerNorm's backward is applied to the skip path too: y = x + Sublayer(LN(x)), the skip bypasses LN."""
    if not self.pre_norm:
        dz = self.norm.backward(dy)
        d_sub, extra = _sub(sublayer, self.dropout.backward(dz))
        dx = dz + d_sub
    else:
        d_sub, extra = _sub(sublayer, self.dropout.backward(dy))
        dx = self.norm.backward(dy + d_sub)
    return (dx, *extra) if extra else dx


def dropout_skipped(self, dy, sublayer):
    """The dropout's backward is skipped: the sub-layer's output went through dropout, so its gradient comes back through it."""
    dz = dy if self.pre_norm else self.norm.backward(dy)
    d_sub, extra = _sub(sublayer, dz)
    dx = dz + (self.norm.backward(d_sub) if self.pre_norm else d_sub)
    return (dx, *extra) if extra else dx


def memory_gradient_dropped(self, dy, sublayer):
    """The memory's gradient is dropped: around encoder-decoder attention the sub-layer returns (dx, dmemory); return both."""
    dz = dy if self.pre_norm else self.norm.backward(dy)
    d_sub, _ = _sub(sublayer, self.dropout.backward(dz))
    return dz + (self.norm.backward(d_sub) if self.pre_norm else d_sub)


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    _, _, src_mask, _ = padded_batch(rng)
    out = []
    for pre in (False, True):
        tag = "pre-LN" if pre else "post-LN"
        rs = RandomState(seed + 5)
        hold = Holder(res=cls(D, dropout=0.1, pre_norm=pre, rng=rs, dtype=np.float64),
                      ffn=FeedForward(D, DFF, rng=rng, dtype=np.float64))
        hold.res.norm.weight.data[:] = 1.0 + 0.5 * rng.standard_normal(D)
        out.append(GradCase("Residual", f"{tag} around the feed-forward network, dropout 0.1 replayed", hold,
                            {"x": rng.standard_normal((B, S, D))}, lambda m, i: m.res(i["x"], m.ffn),
                            lambda m, g: {"x": m.res.backward(g[0], m.ffn)}, before_forward=_replay(rs)))
    for pre in (False, True):
        tag = "pre-LN" if pre else "post-LN"
        rs = RandomState(seed + 6)
        hold = Holder(res=cls(D, dropout=0.1, pre_norm=pre, rng=rs, dtype=np.float64),
                      attn=MultiHeadAttention(D, HEADS, rng=rng, dtype=np.float64))
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("Residual", f"{tag} around encoder-decoder attention (returns dy, dmemory)", hold, ins,
                            lambda m, i: m.res(i["y"], m.attn, i["memory"], mask=src_mask),
                            lambda m, g: named_gradients(m.res.backward(g[0], m.attn), "Residual.backward",
                                                         ("y", "memory")),
                            before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    name="residual", title="the backward of the residual sub-layer", paper="Section 3.1; Xiong et al. 2020",
    target=Residual.backward, layer=Residual, cases=cases, show=(Residual.forward,), swap="Residual",
    mistakes=(skip_path_dropped, skip_path_around_the_norm, norm_on_the_skip_path, dropout_skipped,
              memory_gradient_dropped),
    notes="The children: self.norm (a LayerNorm) and self.dropout, each with backward(dy); self.pre_norm picks "
          "the form. forward used dropout(..., add=x): the sum is part of the dropout's output, and its backward "
          "passes the gradient of the dropped branch only. sublayer.backward(g) returns the gradient of its input, "
          "or a tuple (d_input, d_memory) for encoder-decoder attention: then return (dx, d_memory). The docstring "
          "above gives post-LN; derive pre-LN from its forward.")
