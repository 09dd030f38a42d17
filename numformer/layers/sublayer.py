"""The residual connection around each sub-layer (Section 3.1 and 5.4).

Post-LN, the paper's form:  ``y = LayerNorm(x + Dropout(Sublayer(x)))``.
Pre-LN (Xiong et al. 2020), selectable: ``y = x + Dropout(Sublayer(LayerNorm(x)))``;
a pre-LN stack then ends with one more LayerNorm (see Encoder and Decoder).

The Residual owns the LayerNorm and the Dropout, not the sub-layer: the sub-layer
(attention or feed-forward) is passed to ``forward`` and ``backward`` so its
parameters keep their paper names (``self_attn.w_q``, ``ffn.w_1``). The residual sum
is given to the dropout (``add=``): ``y = x + Dropout(Sublayer(x))`` in one call. Backward, post-LN: ``dz = LN'(dy)``; ``dx = dz + Sublayer'(Dropout'(dz))``.
Shapes: x (batch, time, d_model) -> same.
"""
from __future__ import annotations

from ..backend import DEFAULT_DTYPE
from ..module import Module
from .registry import layer_class, registered


@registered
class Residual(Module):
    """Wraps one sub-layer call with dropout, the residual sum and LayerNorm."""

    kinks = False  # a sum; its norm and dropout are children (Module.kinks: the layer contract)

    def __init__(self, d_model: int, dropout: float = 0.1, pre_norm: bool = False, rng=None,
                 eps: float = 1e-5, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.pre_norm = pre_norm
        self.norm = layer_class("LayerNorm")(d_model, eps=eps, dtype=dtype)
        self.dropout = layer_class("Dropout")(dropout, rng)

    def forward(self, x, sublayer, *args, **kwargs):
        """x (B, T, d_model); ``sublayer(x_in, *args, **kwargs)`` returns (B, T, d_model)."""
        if self.pre_norm:
            y = self.dropout(sublayer(self.norm(x), *args, **kwargs), add=x)          # x + Dropout(Sublayer(LN(x)))
        else:
            y = self.norm(self.dropout(sublayer(x, *args, **kwargs), add=x))          # LN(x + Dropout(Sublayer(x)))
        return y

    def backward(self, dy, sublayer):
        """dy (B, T, d_model) -> dx, or (dx, *extra) when the sub-layer's backward returns extras
        (encoder-decoder attention returns the memory gradient as well)."""
        dz = dy if self.pre_norm else self.norm.backward(dy)
        got = sublayer.backward(self.dropout.backward(dz))
        d_sub, extra = (got[0], got[1:]) if isinstance(got, tuple) else (got, ())
        dx = dz + (self.norm.backward(d_sub) if self.pre_norm else d_sub)
        return (dx, *extra) if extra else dx
