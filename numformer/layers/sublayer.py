"""The residual connection around each sub-layer (Section 3.1 and 5.4).

Post-LN, the paper's form:  ``y = LayerNorm(x + Dropout(Sublayer(x)))``.
Pre-LN (Xiong et al. 2020), selectable: ``y = x + Dropout(Sublayer(LayerNorm(x)))``;
a pre-LN stack then ends with one more LayerNorm (see Encoder and Decoder). The norm is the model's
(``ModelConfig.norm``, a row of :data:`numformer.norms.NORMS`): LayerNorm unless another is chosen.

The Residual owns the LayerNorm and the Dropout, not the sub-layer: the sub-layer
(attention or feed-forward) is passed to ``forward`` and ``backward`` so its
parameters keep their paper names (``self_attn.w_q``, ``ffn.w_1``). The residual sum
is given to the dropout (``add=``): ``y = x + Dropout(Sublayer(x))`` in one call. Backward, post-LN: ``dz = LN'(dy)``; ``dx = dz + Sublayer'(Dropout'(dz))``.
Forward mode and the backward's tangent compose the children's the same way (``x_dot`` takes the
residual path as ``x`` does).
Shapes: x (batch, time, d_model) -> same.
"""
from __future__ import annotations

from ..backend import DEFAULT_DTYPE
from ..module import Module
from ..norms import norm as norm_row
from .registry import layer_class, registered


def norm_layer(norm: str, d_model: int, eps: float = 1e-5, dtype=DEFAULT_DTYPE):
    """The norm called ``norm`` (a name of :data:`numformer.norms.NORMS`) over a last axis of ``d_model``: its row's
    class, as the registry holds it now. ValueError naming the choices for an unknown name."""
    return layer_class(norm_row(norm).layer)(d_model, eps=eps, dtype=dtype)


def norm_from_config(cfg, dtype=DEFAULT_DTYPE):
    """The model's norm (a :class:`numformer.presets.ModelConfig`'s ``norm``, ``d_model`` and ``ln_eps``): every
    Residual's, and a pre-LN stack's final norm."""
    return norm_layer(cfg.norm, cfg.d_model, cfg.ln_eps, dtype)


@registered
class Residual(Module):
    """Wraps one sub-layer call with dropout, the residual sum and LayerNorm."""

    kinks = False  # a sum; its norm and dropout are children (Module.kinks: the layer contract)

    def __init__(self, d_model: int, dropout: float = 0.1, pre_norm: bool = False, rng=None,
                 eps: float = 1e-5, dtype=DEFAULT_DTYPE, norm: str = "layernorm"):
        super().__init__()
        self.pre_norm = pre_norm
        self.norm = norm_layer(norm, d_model, eps, dtype)
        self.dropout = layer_class("Dropout")(dropout, rng)

    @classmethod
    def from_config(cls, cfg, rng=None, dtype=DEFAULT_DTYPE):
        """The residual sub-layer of a model config (numformer.presets.ModelConfig: ``d_model``, ``dropout``,
        ``pre_norm``, ``ln_eps``, ``norm``); ``rng`` the dropout's RandomState."""
        return cls(cfg.d_model, cfg.dropout, cfg.pre_norm, rng, cfg.ln_eps, dtype, norm=cfg.norm)

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

    def jvp(self, x_dot, sublayer, *arg_dots):
        """x_dot (B, T, d_model) -> y_dot; ``arg_dots``: the tangents of forward's extra arrays (the memory)."""
        if self.pre_norm:
            return self.dropout.jvp(sublayer.jvp(self.norm.jvp(x_dot), *arg_dots), add_dot=x_dot)
        return self.norm.jvp(self.dropout.jvp(sublayer.jvp(x_dot, *arg_dots), add_dot=x_dot))

    def backward_jvp(self, dy, dy_dot, sublayer):
        """-> (dx, dx_dot), or ((dx, *extra), (dx_dot, *extra_dot)) as :meth:`backward` has extras."""
        dz, dz_dot = (dy, dy_dot) if self.pre_norm else self.norm.backward_jvp(dy, dy_dot)
        got, got_dot = sublayer.backward_jvp(*self.dropout.backward_jvp(dz, dz_dot))
        extra = isinstance(got, tuple)
        (d_sub, *more), (d_sub_dot, *more_dot) = (got, got_dot) if extra else ((got,), (got_dot,))
        d_in, d_in_dot = self.norm.backward_jvp(d_sub, d_sub_dot) if self.pre_norm else (d_sub, d_sub_dot)
        dx, dx_dot = dz + d_in, dz_dot + d_in_dot
        return ((dx, *more), (dx_dot, *more_dot)) if extra else (dx, dx_dot)
