"""Position-wise feed-forward network (Section 3.3, Eq. 2).

``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``, applied to each position alike.
Shapes: x (..., d_model) -> (..., d_model), inner width d_ff. The activation is the paper's ReLU, or one that
stands in its place (SiLU, Marian's ``swish``, what the opus-mt translators use; GELU): ``activation``, from
``ModelConfig.activation``, a name of :data:`numformer.activations.ACTIVATIONS`, whose row names the layer.
An optional dropout after the activation (tensor2tensor's relu_dropout) is off by default, as in the paper.
"""
from __future__ import annotations

import numpy as np

from ..activations import activation as activation_row
from ..backend import DEFAULT_DTYPE
from ..module import Module
from .init import DEFAULT_SCHEME
from .registry import layer_class, registered


@registered
class FeedForward(Module):
    """Linear(d_model, d_ff) -> activation (ReLU, or the table's ``activation``) -> [Dropout] -> Linear(d_ff, d_model)."""

    def __init__(self, d_model: int, d_ff: int, relu_dropout: float = 0.0, rng=None, dropout_rng=None,
                 dtype=DEFAULT_DTYPE, init: str = DEFAULT_SCHEME, activation: str = "relu"):
        super().__init__()
        layer = activation_row(activation).layer  # ValueError naming the choices for an unknown name
        rng = rng if rng is not None else np.random.default_rng(0)
        self.w_1 = layer_class("Linear")(d_model, d_ff, rng=rng, dtype=dtype, init=init)
        self.activation = layer_class(layer)()
        self.dropout = layer_class("Dropout")(relu_dropout, dropout_rng)
        self.w_2 = layer_class("Linear")(d_ff, d_model, rng=rng, dtype=dtype, init=init)

    @classmethod
    def from_config(cls, cfg, rng=None, dropout_rng=None, dtype=DEFAULT_DTYPE):
        """The feed-forward network of a model config (numformer.presets.ModelConfig: ``d_model``, ``d_ff``,
        ``relu_dropout``, ``init``, ``activation``); weights drawn from ``rng``, the dropout's masks from
        ``dropout_rng``."""
        return cls(cfg.d_model, cfg.d_ff, cfg.relu_dropout, rng, dropout_rng, dtype, cfg.init, activation=cfg.activation)

    def forward(self, x):
        """x (..., d_model) -> (..., d_model)."""
        return self.w_2(self.dropout(self.activation(self.w_1(x))))

    def backward(self, dy):
        return self.w_1.backward(self.activation.backward(self.dropout.backward(self.w_2.backward(dy))))

    def jvp(self, x_dot):
        """Forward mode: the children's tangents in the forward's order."""
        return self.w_2.jvp(self.dropout.jvp(self.activation.jvp(self.w_1.jvp(x_dot))))

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot): the children's backward with its tangent, in the backward's order."""
        return self.w_1.backward_jvp(*self.activation.backward_jvp(*self.dropout.backward_jvp(
            *self.w_2.backward_jvp(dy, dy_dot))))
