"""ReLU, the activation of the position-wise feed-forward network (Eq. 2). Shapes: any -> same.

``y = max(0, x)``; ``dx = dy * [x > 0]`` (the gradient at exactly 0 is taken as 0,
as PyTorch does). Forward mode on the piece the forward saw: ``y_dot = x_dot * [x > 0]``; the backward's
tangent ``dx_dot = dy_dot * [x > 0]`` (each piece is linear: no second-derivative term).
"""
from __future__ import annotations

from ..backend import get_array_module
from ..kernels import kernel
from ..module import Module


def relu_forward(x):
    """-> (y, positive): y = max(0, x) and the active set [x > 0] that backward needs."""
    positive = x > 0
    return get_array_module(x).maximum(x, 0), positive


def relu_backward(dy, positive):
    """dx = dy * [x > 0]."""
    return dy * positive


class ReLU(Module):
    """``max(0, x)``. Saved for backward: ``positive``, the active set ``[x > 0]`` (also :attr:`active_set`).

    Two pieces, the identity where ``x > 0`` and zero elsewhere: ``kinks = True`` (the layer contract,
    numformer/module.py's Module), with :attr:`active_set` and :meth:`forward_on_pieces`."""

    kinks = True

    def forward(self, x):
        y, positive = kernel(relu_forward)(x)
        self.save_for_backward(positive=positive)
        return y

    @property
    def active_set(self):
        """The active set ``[x > 0]`` (bool, x's shape) of the last forward in training mode, until backward
        uses it; None otherwise. The finite-difference checks compare it between the two sides of a probe:
        when it differs, the probe straddles the kink at 0 and measures nothing (numformer.finite_differences.kinks);
        the Hessian tools record it at the point and hold it with :meth:`forward_on_pieces`."""
        return self.saved.get("positive")

    def forward_on_pieces(self, x, pieces):
        """x (any shape) -> ``x * pieces``: each element held on the piece ``pieces`` (bool, x's shape: True
        the identity, False zero, an earlier :attr:`active_set`) whatever the sign of x now; saved for
        backward: ``positive = pieces``, so ``dx = dy * pieces``. What the Hessian tools run to stay on the
        point's pieces (numformer/curvature/hvp.py)."""
        self.save_for_backward(positive=pieces)
        return x * pieces

    def backward(self, dy):
        return kernel(relu_backward)(dy, self.pop_saved("positive"))

    def jvp(self, x_dot):
        """x_dot -> x_dot * [x > 0], on the active set of the forward (held pieces included)."""
        return relu_backward(x_dot, self.peek_saved("positive"))  # the same product: J is diagonal, [x > 0]

    def backward_jvp(self, dy, dy_dot):
        """-> (dy * [x > 0], dy_dot * [x > 0])."""
        dx_dot = relu_backward(dy_dot, self.peek_saved("positive"))  # before the backward, which frees the set
        return self.backward(dy), dx_dot
