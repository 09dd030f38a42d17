"""Hessian-vector products of the training loss with respect to a block of parameters: exact, by forward over
reverse (the default), or by central differences of gradients (the cross-check).

The loss is the label-smoothed cross-entropy, the mean over the batch's target tokens (Section 5.4), of one
fixed batch; the block's other parameters are held.

**Exact** (``method="exact"``): Pearlmutter's R-operator (1994). With the block's tangent ``v`` given to its
parameters (numformer/forward_mode.py), one forward, the model's ``jvp`` (the logits' tangent), the loss's, and
``backward_jvp`` (every layer's backward and its tangent) leave ``H v`` in the block's ``Parameter.grad_tangent``:
the tangent of the gradient along ``v``, exact up to rounding, with no step to choose, in float64 or float32. A
layer with kinks is differentiated on the piece its forward saw (ReLU's ``dx_dot = dy_dot * [x > 0]``), as the
Hessian of a piecewise map is defined wherever no input sits on a kink. Every layer must have its own ``jvp``
and ``backward_jvp`` (the layer contract, numformer/module.py): a model holding one without is refused in one
line (:class:`numformer.module.NoForwardMode`), never given a silent fallback.

**Differences** (``method="differences"``, float64): ``H v ~ (g(theta + h v) - g(theta - h v)) / (2 h)``, ``g`` the
block's gradient from numformer's hand-written backward. The loss must be smooth along the probe: every layer
that declares kinks (``kinks = True``, :class:`numformer.module.Module`: ReLU, or a user's leaky ReLU) keeps the
pieces it was on at the point: its ``active_set`` at theta, recorded once after a forward at the point, then held
by a forward tap (:meth:`numformer.module.Module.tap`) that runs the layer's ``forward_on_pieces(x, pieces)``
instead of its forward (ReLU: ``y = x * S``). A leaf layer that leaves ``kinks`` undeclared is refused in one
line (:class:`numformer.module.UndeclaredKinks`), since a kink nobody declared would silently make the products
wrong. The step and its error: truncation ``h^2 / 6 |g'''[v, v, v]|`` against rounding ``u |g| / h``
(u = 2^-53), smallest near ``h = u^(1/3) ~ 5e-6`` in units of the block's scale: ``h = 5e-6 * max(1, |theta|) /
|v|``. :meth:`BlockHessian.error` estimates the error of one product the Richardson way, from the product at
``h`` and ``h / 2``: ``|Hv(h) - Hv(h / 2)| * 4 / 3``. In float32 (``allow_float32``, for measuring only) the
same step is ``u32^(1/3) ~ 5e-3`` and the products carry about 1e-3 of error (docs/studies.md, hessian-blocks).

Both need dropout off (the model built without it: refused otherwise), and both restore the weights exactly.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..forward_mode import tangents
from ..layers import Dropout
from ..loss import LabelSmoothedCrossEntropy
from ..module import UndeclaredKinks, forward_mode_layers, kinked_layers, tapped
from ..parameter_buffer import ParameterBuffer

STEP = 5e-6          # u^(1/3) for float64, in units of the block's scale
STEP_FLOAT32 = 5e-3  # u^(1/3) for float32 (2^-24)
METHODS = ("exact", "differences")


class BlockHessian:
    """``H v`` for the parameters ``names`` of ``model`` (no dropout) at its current weights, on ``batch`` =
    (src, tgt_in, tgt_out). ``v`` and ``H v`` are flat vectors over the block, in the order of ``names``, in the
    model's dtype. ``method``: ``"exact"`` (forward over reverse, any float dtype) or ``"differences"`` (central
    differences of gradients, float64; ``allow_float32`` to measure them in float32)."""

    def __init__(self, model, batch, names, label_smoothing: float | None = None, method: str = "exact",
                 allow_float32: bool = False):
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        params = dict(model.named_parameters())
        unknown = [n for n in names if n not in params]
        if unknown:
            raise KeyError(f"no parameter {unknown[0]!r} in the model")
        dtypes = {p.data.dtype for p in params.values()}
        if method == "differences" and dtypes != {np.dtype(np.float64)} and not allow_float32:
            raise ValueError("Hessian-vector products by differences need a float64 model (dtype=np.float64); "
                             "the exact method (method='exact') takes float32 too")
        if any(isinstance(m, Dropout) and m.p > 0 for m in model.modules()):
            raise ValueError("Hessian-vector products need the loss smooth along the probe: build the model "
                             "with dropout 0")
        self.model, self.batch, self.names, self.method = model, batch, list(names), method
        self._named = list(params.items())  # walked once: every product gives every parameter a tangent
        self._buffer = ParameterBuffer.of([p for _, p in self._named])  # zeroed whole, not tensor by tensor
        self.params = [params[n] for n in self.names]
        self.sizes = [p.size for p in self.params]
        eps = model.cfg.label_smoothing if label_smoothing is None else label_smoothing
        self.crit = LabelSmoothedCrossEntropy(eps, model.cfg.pad_id)
        self.xp = get_array_module(self.params[0].data)
        self.dtype = self.params[0].data.dtype
        self.scale = max(1.0, float(np.sqrt(sum(float((p.data * p.data).sum()) for p in self.params))))
        self.evaluations = 0  # passes run: a gradient (forward and backward) or an exact product (with tangents)
        if method == "exact":
            forward_mode_layers(model, "exact Hessian-vector products")  # refuses a layer without jvp, in one line
        else:
            self._kinked = kinked_layers(model, "Hessian-vector products")  # refuses an undeclared leaf layer
            self._sets = self._record_pieces()

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    # -- exact: forward over reverse ------------------------------------------------------------------------
    def exact(self, v):
        """``H v`` by the R-operator: one forward, jvp and backward_jvp with ``v`` as the block's tangent."""
        src, tgt_in, tgt_out = self.batch
        xp, model = self.xp, self.model
        with tangents(model, dict(zip(self.names, self._split(xp.asarray(v, dtype=self.dtype)))), self._named,
                      wanted=self.names):  # the block's gradient tangents alone are computed
            model.train()
            self._buffer.zero_grad()
            logits = model(xp.asarray(src), xp.asarray(tgt_in))
            logits_dot = model.jvp()
            self.crit.forward(logits, xp.asarray(tgt_out))
            self.crit.jvp(logits_dot)
            model.backward_jvp(*self.crit.backward_jvp())
            self.evaluations += 1
            hv = xp.concatenate([p.grad_tangent.reshape(-1) for p in self.params])
        self._buffer.zero_grad()
        return hv

    # -- differences: the point's pieces of every kinked layer, held ------------------------------------------
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

    def _loss_and_backward(self):
        src, tgt_in, tgt_out = self.batch
        xp, model = self.xp, self.model
        model.train()
        self._buffer.zero_grad()
        loss = self.crit.forward(model(xp.asarray(src), xp.asarray(tgt_in)), xp.asarray(tgt_out))
        model.backward(self.crit.backward())
        self.evaluations += 1
        return loss

    def gradient(self, shift=None):
        """The block's gradient (flat) at the point, or at the point + ``shift`` (flat); the kinked layers'
        pieces held (the differences' gradient)."""
        saved = [p.data.copy() for p in self.params] if shift is not None else None
        try:
            with self._held():
                if shift is not None:
                    for p, part in zip(self.params, self._split(shift)):
                        p.data += part
                self._loss_and_backward()
                return self.xp.concatenate([p.grad.reshape(-1) for p in self.params]).astype(self.dtype)
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
        """The difference step h for the direction ``v``: STEP (STEP_FLOAT32) in units of the block's scale."""
        norm = float(self.xp.sqrt((v * v).sum()))
        unit = STEP if self.dtype == np.float64 else STEP_FLOAT32
        return unit * self.scale / max(norm, 1e-300)

    def differences(self, v, h: float | None = None):
        """``H v`` by the central difference of the block's gradient with step ``h`` (default :meth:`step`)."""
        if self.method != "differences":
            raise ValueError("this BlockHessian is exact: build one with method='differences' for the differences")
        h = self.step(v) if h is None else h
        return (self.gradient(h * v) - self.gradient(-h * v)) / (2.0 * h)

    def __call__(self, v, h: float | None = None):
        """``H v`` by the block's method (``h``: the differences' step)."""
        return self.exact(v) if self.method == "exact" else self.differences(v, h)

    def error(self, v) -> float:
        """The differences' error estimate (an absolute norm), Richardson's: ``|Hv(h) - Hv(h/2)| * 4/3``."""
        h = self.step(v)
        full, half = self.differences(v, h), self.differences(v, h / 2)
        return float(self.xp.sqrt(((full - half) ** 2).sum())) * 4.0 / 3.0

    def dense(self):
        """The block's whole Hessian, ``dim`` products with the unit vectors (for tiny blocks; symmetrised)."""
        xp = self.xp
        cols = []
        for i in range(self.dim):
            e = xp.zeros(self.dim, dtype=self.dtype)
            e[i] = 1.0
            cols.append(self(e))
        h = xp.stack(cols, axis=1)
        return (h + h.T) / 2.0


def layer_blocks(model) -> dict:
    """Per-layer blocks, for spectra layer by layer (what PyHessian's users ask for): ``"encoder.layers.0"`` ->
    the names of every parameter of that layer, and so for each decoder layer, the final norms of a pre-LN
    stack, the embeddings and positions, the output projection when untied; in the model's order."""
    blocks: dict = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        key = ".".join(parts[:3]) if parts[1:2] == ["layers"] else ".".join(parts[:-1])
        blocks.setdefault(key, []).append(name)
    return blocks


def input_hvp(layer, x, v, upstream, **forward_kwargs):
    """``H v`` of the scalar ``<layer(x, **forward_kwargs), upstream>`` with respect to the layer's one float input
    ``x``, exact: the R-operator with ``v`` as x's tangent, the parameters' tangents zero (the layer in training
    mode, no dropout). -> the array of x's shape: the tangent of the input's gradient."""
    xp = get_array_module(x)
    layer.train()
    with tangents(layer):
        layer(x, **forward_kwargs)
        layer.jvp(v)
        _, dx_dot = layer.backward_jvp(upstream, xp.zeros_like(upstream))
    layer.zero_grad()
    return dx_dot
