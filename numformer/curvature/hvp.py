"""Hessian-vector products of the training loss with respect to a block of parameters, by central differences
of numformer's own gradients, in float64.

``H v ~ (g(theta + h v) - g(theta - h v)) / (2 h)``, with ``g`` the gradient of the block (the other
parameters held) from numformer's hand-written backward. The loss is the label-smoothed cross-entropy, the
mean over the batch's target tokens (Section 5.4), of one fixed batch.

What makes the difference quotient a Hessian: the loss must be smooth along the probe. Dropout is off (the
model must be built without it: refused otherwise), and every layer that declares kinks (``kinks = True``, the
layer contract of :class:`numformer.module.Module`: ReLU, or a user's leaky ReLU) keeps the pieces it was on at
the point: its ``active_set`` at theta (ReLU's ``[x > 0]``), recorded once after a forward at the point, then
held by a forward tap (:meth:`numformer.module.Module.tap`) that runs the layer's ``forward_on_pieces(x,
pieces)`` instead of its forward (ReLU: ``y = x * S``). Within those pieces the network is smooth, and the
pieces' Hessian at theta is the Hessian at theta (which exists wherever no input sits exactly on a kink), so
no probe crosses a kink whatever its size. No class is tested: a model holding a leaf layer that leaves
``kinks`` undeclared is refused in one line (:class:`numformer.module.UndeclaredKinks`), since a kink nobody
declared would silently make the products wrong.

The step and its error: the truncation error of the central difference is ``h^2 / 6 |g'''[v, v, v]|`` and the
rounding error about ``u |g| / h`` (u = 2^-53); their sum is smallest near ``h = u^(1/3) ~ 5e-6`` in units of
the block's scale, so ``h = 5e-6 * max(1, |theta|) / |v|``. :meth:`BlockHessian.error` estimates the error of
one product the Richardson way, from the same product at ``h`` and ``h / 2`` (the truncation term shrinks
four-fold): ``|Hv(h) - Hv(h / 2)| * 4 / 3`` bounds it as long as truncation dominates.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..layers import Dropout
from ..loss import LabelSmoothedCrossEntropy
from ..module import UndeclaredKinks, kinked_layers, tapped

STEP = 5e-6  # u^(1/3) for float64, in units of the block's scale


class BlockHessian:
    """``H v`` for the parameters ``names`` of ``model`` (float64, no dropout) at its current weights, on
    ``batch`` = (src, tgt_in, tgt_out). ``v`` and ``H v`` are flat float64 vectors over the block, in the order
    of ``names``. The weights are restored exactly after every product."""

    def __init__(self, model, batch, names, label_smoothing: float | None = None):
        params = dict(model.named_parameters())
        unknown = [n for n in names if n not in params]
        if unknown:
            raise KeyError(f"no parameter {unknown[0]!r} in the model")
        if any(p.data.dtype != np.float64 for p in params.values()):
            raise ValueError("Hessian-vector products by differences need a float64 model (dtype=np.float64)")
        if any(isinstance(m, Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError("Hessian-vector products need the loss smooth along the probe: build the model "
                             "with dropout 0")
        self.model, self.batch, self.names = model, batch, list(names)
        self.params = [params[n] for n in self.names]
        self.sizes = [p.size for p in self.params]
        eps = model.cfg.label_smoothing if label_smoothing is None else label_smoothing
        self.crit = LabelSmoothedCrossEntropy(eps, model.cfg.pad_id)
        self.xp = get_array_module(self.params[0].data)
        self.scale = max(1.0, float(np.sqrt(sum(float((p.data * p.data).sum()) for p in self.params))))
        self.evaluations = 0  # forward and backward passes run (two per product)
        self._kinked = kinked_layers(model, "Hessian-vector products")  # refuses an undeclared leaf layer
        self._sets = self._record_pieces()

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    # -- the point's pieces of every kinked layer, held ---------------------------------------------------
    def _record_pieces(self) -> dict:
        """{id(layer): its active_set at the point} for every layer declaring kinks, read after its forward in
        a forward and backward at the point (ReLU: ``[x > 0]``)."""
        sets = {}

        def record(m, forward, *args, **kwargs):
            y = forward(*args, **kwargs)
            sets[id(m)] = m.active_set
            if sets[id(m)] is None:
                raise UndeclaredKinks(f"{type(m).__name__} declares kinks = True but kept no active_set in a "
                                      "training forward: its active_set must say which piece each element was on")
            return y
        with tapped(self._kinked, forward=record):
            self._loss_and_backward()
        return sets

    def _held(self):
        """A context in which every kinked layer stays on its recorded pieces S: its forward runs as
        ``forward_on_pieces(x, pieces=S)`` (ReLU: ``y = x * S``, saving S for ``dx = dy * S``), whatever its
        input under the probe. The taps go on when the block is entered, not when this is called."""
        def hold(m, forward, *args, **kwargs):
            return m.forward_on_pieces(*args, pieces=self._sets[id(m)], **kwargs)
        return tapped(self._kinked, forward=hold)

    # -- the gradient of the block -----------------------------------------------------------------------
    def _loss_and_backward(self):
        src, tgt_in, tgt_out = self.batch
        xp, model = self.xp, self.model
        model.train()
        model.zero_grad()
        loss = self.crit.forward(model(xp.asarray(src), xp.asarray(tgt_in)), xp.asarray(tgt_out))
        model.backward(self.crit.backward())
        self.evaluations += 1
        return loss

    def gradient(self, shift=None):
        """The block's gradient (flat) at the point, or at the point + ``shift`` (flat); the kinked layers'
        pieces held."""
        saved = [p.data.copy() for p in self.params] if shift is not None else None
        try:
            with self._held():
                if shift is not None:
                    for p, part in zip(self.params, self._split(shift)):
                        p.data += part
                self._loss_and_backward()
                return self.xp.concatenate([p.grad.reshape(-1) for p in self.params]).astype(np.float64)
        finally:
            if saved is not None:
                for p, s in zip(self.params, saved):
                    p.data[...] = s

    def _split(self, flat):
        out, start = [], 0
        for p, n in zip(self.params, self.sizes):
            out.append(flat[start:start + n].reshape(p.shape))
            start += n
        return out

    def step(self, v) -> float:
        """The difference step h for the direction ``v``: STEP in units of the block's scale."""
        norm = float(self.xp.sqrt((v * v).sum()))
        return STEP * self.scale / max(norm, 1e-300)

    def __call__(self, v, h: float | None = None):
        """``H v`` by the central difference with step ``h`` (default :meth:`step`)."""
        h = self.step(v) if h is None else h
        return (self.gradient(h * v) - self.gradient(-h * v)) / (2.0 * h)

    def error(self, v) -> float:
        """Richardson's estimate of the error of ``H v`` (an absolute norm): ``|Hv(h) - Hv(h/2)| * 4/3``."""
        h = self.step(v)
        full, half = self(v, h), self(v, h / 2)
        return float(self.xp.sqrt(((full - half) ** 2).sum())) * 4.0 / 3.0

    def dense(self):
        """The block's whole Hessian, ``dim`` products with the unit vectors (for tiny blocks; symmetrised)."""
        xp = self.xp
        cols = []
        for i in range(self.dim):
            e = xp.zeros(self.dim)
            e[i] = 1.0
            cols.append(self(e))
        h = xp.stack(cols, axis=1)
        return (h + h.T) / 2.0
