"""Exercise: the backward of the residual connection around a sub-layer (Section 3.1), post- and pre-LN."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
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
    stage="composition",
    name="residual", title="the backward of the residual sub-layer", paper="Section 3.1; Xiong et al. 2020",
    target=Residual.backward, layer=Residual, cases=cases, show=(Residual.forward,), swap="Residual",
    mistakes=(skip_path_dropped, skip_path_around_the_norm, norm_on_the_skip_path, dropout_skipped,
              memory_gradient_dropped),
    notes="The children: self.norm (a LayerNorm) and self.dropout, each with backward(dy); self.pre_norm picks "
          "the form. forward used dropout(..., add=x): the sum is part of the dropout's output, and its backward "
          "passes the gradient of the dropped branch only. sublayer.backward(g) returns the gradient of its input, "
          "or a tuple (d_input, d_memory) for encoder-decoder attention: then return (dx, d_memory). The docstring "
          "above gives post-LN; derive pre-LN from its forward.",
    forward="""
        The forward: the residual connection around each sublayer (Section 3.1, with dropout on the sublayer's
        output, Section 5.4), in one of two forms picked by self.pre_norm. Post-LN, the paper's form
        (self.pre_norm False), LayerNorm(x + Dropout(Sublayer(x))), in order:

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
        backward(g), g the gradient of the dropout call's output, returns the gradient of the dropped branch s
        only; the gradient of the add= input is not part of what it returns (with dropout off, Dropout(s) = s
        and its backward returns g as it is).
        sublayer.backward(g), g the gradient of the sublayer's output (B, T, d_model), returns the gradient
        of its first input, or, for encoder-decoder attention, the tuple (d_input, d_memory), and adds its
        parameters' gradients itself. Each child's backward uses what its forward cached, once: call each
        exactly once. Return dx = dL/dx (B, T, d_model), or the tuple (dx, d_memory) when the sublayer's
        backward returned one.""",
    returns="Return dL/dx (B, T, d_model), from dy = dL/dy (B, T, d_model), in either form (self.pre_norm); or "
            "(dL/dx, dL/dmemory) when the sublayer's backward returns (d_input, d_memory).",
    steps=("Two rules do all the work. A sum a + b hands its gradient unchanged to both terms. A chain of "
           "functions runs backward from the last one: each child's backward takes the gradient of that child's "
           "output. And x is used twice in either form (the skip path and the sub-layer's path), so dx is the "
           "sum of the two paths' gradients.",
           "Post-LN, y = LayerNorm(z) is the last step: the LayerNorm's backward on dy gives dz. Everything "
           "before it reaches y through z, so both paths get dz, not dy: the skip path's gradient also goes "
           "through the LayerNorm's backward.",
           "Post-LN, z = x + Dropout(s): the skip term x gets dz as it is; the dropout's backward on dz gives ds "
           "(the dropped branch only); the sub-layer's backward on ds gives the gradient of its input, which is "
           "x. So dx = dz + Sublayer'(Dropout'(dz)), where F'(g) means F's backward applied to g. Skipping the "
           "dropout's backward is wrong whenever dropout is on: the dropped entries passed nothing forward and "
           "the kept ones were scaled by 1/(1 - p).",
           "Pre-LN, y = x + Dropout(s) is the last step: the skip term x gets dy as it is (it bypasses the "
           "LayerNorm, so no LayerNorm backward on it); the dropout's backward on dy gives ds; the sub-layer's "
           "backward gives du, the gradient of u = LayerNorm(x); the LayerNorm's backward on du gives that "
           "path's share of dx. So dx = dy + LN'(Sublayer'(Dropout'(dy))): the LayerNorm's backward runs once, "
           "on the sub-layer's path only.",
           "The whole backward, both forms at once: dz = dy if self.pre_norm else self.norm.backward(dy); got = "
           "sublayer.backward(self.dropout.backward(dz)); if got is a tuple, d_sub, d_memory = got, else d_sub = "
           "got; dx = dz + (self.norm.backward(d_sub) if self.pre_norm else d_sub); return (dx, d_memory) when "
           "there was a memory gradient, dx otherwise. The memory's gradient passes through untouched: the "
           "residual's own operations never saw the memory."))
