"""Token embedding scaled by sqrt(d_model) (Section 3.4).

Shapes: ids (batch, time) int -> (batch, time, d_model). The weight (vocab, d_model)
may be a Parameter shared with another Embedding and with the pre-softmax
projection (weight tying, Section 3.4 and Press & Wolf 2017); backward therefore
*adds* into it. Backward is a scatter-add over token ids, ``dW[id] += scale * dy``
summed over every position holding that id: no dense one-hot.

The pad row's gradient rule (``padding_idx``, PyTorch's ``nn.Embedding(padding_idx=pad)``, which Marian's
opus-mt models use): the lookups give row ``padding_idx`` no gradient, ``dW[id] += scale * dy_t`` over the
positions t with ``id = ids_t != padding_idx`` only. Forward still reads that row. The rule is not the
derivative of the forward where a pad lookup reaches the loss (Marian's decoder starts from pad): it is
the gradient of a forward whose pad lookups read a constant, the row held at its value. A tied
pre-softmax projection still gives the row its gradient through the logits (numformer.layers.projection).

Forward mode: the lookup is linear in W, so ``y_dot = W_dot[ids] * scale`` (ids have no tangent); with
``padding_idx``, of the forward the rule differentiates, whose pad lookups read a constant: 0 at those
positions, so that forward and reverse mode are each other's transpose. The backward is linear in dy and does
not read W, so its tangent is the same scatter of ``dy_dot``: ``dW_dot[id] += scale * dy_dot``, the same rule.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module, scatter_add
from ..kernels import kernel
from ..module import Module, Parameter
from .registry import registered


def vocab_matrix(vocab_size: int, d_model: int, weight: Parameter | None, rng, dtype) -> Parameter:
    """The (vocab, d_model) matrix of an embedding or the pre-softmax projection.

    A given ``weight`` (tying) is checked for shape; otherwise a new one is drawn
    from N(0, d_model^-1/2), so that rows times sqrt(d_model) have unit variance.
    """
    if weight is None:
        rng = rng if rng is not None else np.random.default_rng(0)
        weight = Parameter(rng.normal(0.0, d_model ** -0.5, (vocab_size, d_model)).astype(dtype))
    if weight.shape != (vocab_size, d_model):
        raise ValueError(f"tied weight has shape {weight.shape}, expected {(vocab_size, d_model)}")
    return weight


def embedding_backward(grad, ids, dy, scale: float):
    """grad (V, d) += scatter of dy (n, d) * scale to the rows ids (n,) (repeated ids sum); returns grad."""
    return scatter_add(grad, ids, dy * scale)


def without_padding_rows(ids, dy, padding_idx: int):
    """dy (n, d) with the rows of the positions holding ``padding_idx`` (ids (n,)) zeroed: those lookups give
    the pad row no gradient. A new array (dy is the caller's)."""
    xp = get_array_module(dy)
    return xp.where((ids == padding_idx)[:, None], 0, dy)


@registered
class Embedding(Module):
    """Lookup ``W[ids] * scale``; weights ~ N(0, d_model^-1/2) so scaled rows have unit variance.

    ``padding_idx``: the row whose lookups give it no gradient (None: every row gets gradient, the paper's).
    Saved for backward: ``ids``, on the weight's device."""

    kinks = False  # a lookup: linear in the weight (Module.kinks: the layer contract)

    def __init__(self, vocab_size: int, d_model: int, scale: bool = True, weight: Parameter | None = None,
                 rng=None, dtype=DEFAULT_DTYPE, padding_idx: int | None = None):
        super().__init__()
        self.weight = vocab_matrix(vocab_size, d_model, weight, rng, dtype)
        self.vocab_size, self.d_model = vocab_size, d_model
        self.scale = math.sqrt(d_model) if scale else 1.0
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ValueError(f"padding_idx {padding_idx} is not a row of the {vocab_size}-row embedding")
        self.padding_idx = padding_idx

    def forward(self, ids):
        """ids (...,) int -> (..., d_model)."""
        ids = get_array_module(self.weight.data).asarray(ids)  # host ids for a device weight are moved
        out = self.weight.data[ids] * self.scale
        self.save_for_backward(ids=ids)
        return out

    def backward(self, dy):
        """dy (..., d_model) -> None (ids have no gradient); scatter-adds dy * scale into W, except into row
        ``padding_idx`` (when set) from the positions that looked it up."""
        ids, dy = self.pop_saved("ids").reshape(-1), dy.reshape(-1, self.d_model)
        if self.padding_idx is not None:
            dy = without_padding_rows(ids, dy, self.padding_idx)
        kernel(embedding_backward)(self.weight.grad, ids, dy, self.scale)
        return None

    def jvp(self):
        """-> y_dot = W_dot[ids] * scale (..., d_model), the lookup of the weight's tangent (0 where ids hold
        ``padding_idx``, when set: the rule's constant)."""
        ids, w_dot = self.peek_saved("ids"), self.weight.nonzero_tangent
        xp = get_array_module(self.weight.data)
        if w_dot is None:  # a zero tangent: the lookups' tangent is zero
            return xp.zeros((*ids.shape, self.d_model), dtype=self.weight.data.dtype)
        y_dot = w_dot[ids] * self.scale
        if self.padding_idx is not None:
            y_dot[ids == self.padding_idx] = 0
        return y_dot

    def backward_jvp(self, dy, dy_dot):
        """-> (None, None); scatter-adds dy into the gradient and dy_dot into its tangent, the same rule."""
        if self.weight.wants_grad_tangent:
            ids, dy_dot = self.peek_saved("ids").reshape(-1), dy_dot.reshape(-1, self.d_model)
            if self.padding_idx is not None:
                dy_dot = without_padding_rows(ids, dy_dot, self.padding_idx)
            embedding_backward(self.weight.grad_tangent, ids, dy_dot, self.scale)
        return self.backward(dy), None
