"""The residual connection around each sub-layer (Section 3.1 and 5.4).

Post-LN, the paper's form:  ``y = LayerNorm(x + Dropout(Sublayer(x)))``.
Pre-LN (Xiong et al. 2020), selectable: ``y = x + Dropout(Sublayer(LayerNorm(x)))``;
a pre-LN stack then ends with one more LayerNorm (see Encoder and Decoder).

The Residual owns the LayerNorm and the Dropout, not the sub-layer: the sub-layer
(attention or feed-forward) is passed to ``forward`` and ``backward`` so its
parameters keep their paper names (``self_attn.w_q``, ``ffn.w_1``). A sub-layer whose
class sets ``fresh_output = True`` (attention, feed-forward) returns a new array from
forward and from backward that nothing else holds: dropout and the residual sum are
then done in place on it, in one blocked pass. Shapes:
x (batch, time, d_model) -> same.
"""
from __future__ import annotations

from ..backend import DEFAULT_DTYPE
from ..module import Module
from .dropout import Dropout
from .layernorm import LayerNorm


class Residual(Module):
    """Wraps one sub-layer call with dropout, the residual sum and LayerNorm."""

    def __init__(self, d_model: int, dropout: float = 0.1, pre_norm: bool = False, rng=None,
                 eps: float = 1e-5, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.pre_norm = pre_norm
        self.norm = LayerNorm(d_model, eps=eps, dtype=dtype)
        self.dropout = Dropout(dropout, rng)
        self.record_stats = False  # when set, forward keeps (mean, std) of its output (train.py --log-grads)
        self.output_stats = None

    def forward(self, x, sublayer, *args, **kwargs):
        """x (B, T, d_model); ``sublayer(x_in, *args, **kwargs)`` returns (B, T, d_model)."""
        fresh = getattr(sublayer, "fresh_output", False)
        if self.pre_norm:
            y = self.dropout(sublayer(self.norm(x), *args, **kwargs), inplace=fresh, add=x)
        else:
            y = self.norm(self.dropout(sublayer(x, *args, **kwargs), inplace=fresh, add=x))
        if self.record_stats:  # two reductions, only on logged steps; kept on the device
            self.output_stats = (y.mean(), y.std())
        return y

    def backward(self, dy, sublayer):
        """dy (B, T, d_model) -> dx, or (dx, *extra) when the sub-layer's backward returns extras
        (encoder-decoder attention returns the memory gradient as well)."""
        fresh = getattr(sublayer, "fresh_output", False)
        if self.pre_norm:
            got = sublayer.backward(self.dropout.backward(dy))
            d_sub, extra = (got[0], got[1:]) if isinstance(got, tuple) else (got, ())
            dx = self.norm.backward(d_sub)  # a fresh array: add the residual path into it
            dx += dy
        else:
            dz = self.norm.backward(dy)
            got = sublayer.backward(self.dropout.backward(dz))
            d_sub, extra = (got[0], got[1:]) if isinstance(got, tuple) else (got, ())
            if fresh:  # the sub-layer's input gradient is its own new array
                d_sub += dz
                dx = d_sub
            else:
                dx = dz + d_sub
        return (dx, *extra) if extra else dx
