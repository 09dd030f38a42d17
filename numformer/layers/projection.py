"""Pre-softmax linear transformation ``logits = h W_E^T`` (Section 3.4).

Shapes: h (..., d_model) -> logits (..., vocab). The weight (vocab, d_model) is the
embedding matrix when tied (the paper shares it between both embeddings and this
projection), so backward adds ``dlogits^T h`` into the same Parameter that the
embeddings add into. Untied, it is a matrix of its own with the same layout.

Forward mode: ``logits_dot = h_dot W^T + h W_dot^T``. The backward's tangent:
``dW_dot = dlogits_dot^T h + dlogits^T h_dot``, ``dh_dot = dlogits_dot W + dlogits W_dot``.
"""
from __future__ import annotations


from ..backend import DEFAULT_DTYPE, matmul
from ..module import Module, Parameter
from .embedding import vocab_matrix
from .registry import registered


@registered
class OutputProjection(Module):
    """``logits = h @ W.T`` with W (vocab, d_model), no bias. Saved for backward: ``h`` (..., d_model); by jvp:
    ``h``, its tangent."""

    kinks = False  # linear (Module.kinks: the layer contract)

    def __init__(self, d_model: int, vocab_size: int, weight: Parameter | None = None, rng=None,
                 dtype=DEFAULT_DTYPE):
        super().__init__()
        self.weight = vocab_matrix(vocab_size, d_model, weight, rng, dtype)
        self.d_model, self.vocab_size = d_model, vocab_size

    def forward(self, h):
        """h (..., d_model) -> logits (..., vocab)."""
        lead = h.shape[:-1]
        logits = matmul(h.reshape(-1, self.d_model), self.weight.data.T)  # plain @ unless a lower precision is set
        self.save_for_backward(h=h)
        return logits.reshape(*lead, self.vocab_size)

    def backward(self, dlogits):
        """dlogits (..., vocab) -> dh (..., d_model); adds dlogits^T h into W."""
        h2 = self.pop_saved("h").reshape(-1, self.d_model)
        d2 = dlogits.reshape(-1, self.vocab_size)
        self.weight.grad += matmul(d2.T, h2)
        return matmul(d2, self.weight.data).reshape(*dlogits.shape[:-1], self.d_model)

    def jvp(self, h_dot):
        """h_dot (..., d_model) -> logits_dot (..., vocab) = h_dot W^T + h W_dot^T."""
        h2, h_dot2 = self.peek_saved("h").reshape(-1, self.d_model), h_dot.reshape(-1, self.d_model)
        self.save_tangents(h=h_dot)
        logits_dot, w_dot = matmul(h_dot2, self.weight.data.T), self.weight.nonzero_tangent
        if w_dot is not None:
            logits_dot = logits_dot + matmul(h2, w_dot.T)
        return logits_dot.reshape(*h_dot.shape[:-1], self.vocab_size)

    def backward_jvp(self, dlogits, dlogits_dot):
        """-> (dh, dh_dot); adds dW into the gradient and dW_dot = dlogits_dot^T h + dlogits^T h_dot into its
        tangent."""
        h2, h_dot2 = self.peek_saved("h").reshape(-1, self.d_model), self.pop_tangents("h").reshape(-1, self.d_model)
        d2, d2_dot = dlogits.reshape(-1, self.vocab_size), dlogits_dot.reshape(-1, self.vocab_size)
        if self.weight.wants_grad_tangent:
            self.weight.grad_tangent += matmul(d2_dot.T, h2) + matmul(d2.T, h_dot2)
        dh_dot, w_dot = matmul(d2_dot, self.weight.data), self.weight.nonzero_tangent
        if w_dot is not None:
            dh_dot = dh_dot + matmul(d2, w_dot)
        return self.backward(dlogits), dh_dot.reshape(*dlogits.shape[:-1], self.d_model)
