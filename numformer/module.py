"""Parameter and Module: the bookkeeping every layer shares.

A :class:`Module` finds its children and parameters from its attributes, in the
order they were assigned, so names are stable and dotted like PyTorch's
(``encoder.layers.0.self_attn.w_q.weight``). Lists of modules are indexed by
position. A parameter reachable under two names (tied embeddings) is listed once,
under the first name, and receives the gradient of every use because backward
passes *add* into ``Parameter.grad``.
"""
from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from types import MappingProxyType

import numpy as np

from .backend import get_array_module, to_host, to_xp
from .errors import NumformerError
from .parameter_buffer import ParameterBuffer


class Parameter:
    """A trainable array and its gradient (same shape, dtype and device).

    ``grad`` accumulates: every backward does ``grad += ...`` so a weight used in
    several places (tied embeddings) collects the gradient of each use.

    In a built model ``data`` and ``grad`` are views into the model's one parameter buffer
    (:mod:`numformer.parameter_buffer`; ``packed_in`` is that buffer, None outside one): write into
    them (``p.data[...] = w``, ``p.grad += g``), never assign new arrays to them. A copy of a
    Parameter (``copy.deepcopy``, pickle) owns its arrays and is outside any buffer.
    """

    __slots__ = ("data", "grad", "packed_in", "_tangent", "_grad_tangent", "_wanted")

    def __init__(self, data):
        self.data = data
        xp = get_array_module(data)
        self.grad = xp.zeros_like(data)
        self.packed_in = None
        self._tangent = self._grad_tangent = None
        self._wanted = True

    def __reduce__(self):
        # a copy owns its arrays (deepcopy copies a view into a fresh array) and is in no buffer
        return _parameter_with_grad, (self.data, self.grad)

    @property
    def shape(self):
        return self.data.shape

    @property
    def size(self) -> int:
        return int(self.data.size)

    def zero_grad(self) -> None:
        self.grad.fill(0)

    # -- forward mode (numformer/forward_mode.py sets these for the length of a block) ----------------
    # _mode: None outside forward mode; else (tangent or None where it is zero, whether grad_tangent is wanted)
    @property
    def tangent(self):
        """The direction this parameter moves along in forward mode (``theta_dot``, data's shape): what a
        layer's ``jvp`` reads, as ``backward`` adds into ``grad``. Set by :func:`numformer.forward_mode.tangents`
        (a zero tangent for the parameters it is not given, made when first read); outside such a block a
        ``jvp`` has nothing to read, said in one line."""
        if self._tangent is None:
            raise NoTangent("a jvp read a parameter's tangent outside forward mode: give the parameters their "
                            "tangents first, `with numformer.forward_mode.tangents(model, {name: direction}):`")
        if self._tangent is _ZERO:
            self._tangent = get_array_module(self.data).zeros_like(self.data)
        return self._tangent

    @property
    def nonzero_tangent(self):
        """The tangent, or None where it is zero (a parameter outside the block given tangents): numformer's
        layers leave that tangent's terms out (``x W_dot`` is not computed for a zero ``W_dot``)."""
        return None if self._tangent is _ZERO else self.tangent

    @property
    def grad_tangent(self):
        """The tangent of ``grad`` along the parameters' and inputs' tangents (Pearlmutter's R{grad}): a layer's
        ``backward_jvp`` *adds* into it as its backward adds into ``grad``; for the loss's parameters it is the
        Hessian-vector product ``H v``. Zero at the start of a :func:`numformer.forward_mode.tangents` block."""
        if self._grad_tangent is None:
            raise NoTangent("a backward_jvp added into a parameter's grad_tangent outside forward mode: give the "
                            "parameters their tangents first, `with numformer.forward_mode.tangents(model, ...)`")
        if self._grad_tangent is _UNWANTED:  # nobody reads it; a layer that adds into it anyway gets scratch
            self._grad_tangent = get_array_module(self.data).zeros_like(self.data)
            self._wanted = False
        return self._grad_tangent

    @grad_tangent.setter
    def grad_tangent(self, value) -> None:  # what ``p.grad_tangent += g`` writes back (the same array)
        self._grad_tangent = value

    @property
    def wants_grad_tangent(self) -> bool:
        """Whether anyone reads this parameter's grad_tangent (:func:`numformer.forward_mode.tangents`' ``wanted``):
        numformer's layers compute it only then (the products of one block need the block's alone)."""
        return self._grad_tangent is not None and self._grad_tangent is not _UNWANTED and self._wanted

    def set_tangents(self, tangent, grad_tangent) -> None:
        """Give this parameter its tangent (an array, or :data:`ZERO`) and a grad_tangent to add into (an array,
        or :data:`UNWANTED`); both None: forward mode off."""
        self._tangent, self._grad_tangent, self._wanted = tangent, grad_tangent, True

    def to(self, xp, dtype=None) -> None:
        """New arrays on ``xp`` (cast to ``dtype``), outside any buffer (:meth:`Module.to` packs them again)."""
        self.data = to_xp(self.data, xp, dtype)
        self.grad = xp.zeros_like(self.data)
        self.packed_in = None

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


#: A parameter's tangent that is zero (numformer.forward_mode.tangents gives it to every parameter outside the
#: block): an array of zeros is made only if a layer reads ``Parameter.tangent``.
ZERO = _ZERO = type("ZeroTangent", (), {"__repr__": lambda self: "ZERO"})()
#: A grad_tangent nobody reads (outside the block whose products are asked for).
UNWANTED = _UNWANTED = type("UnwantedGradTangent", (), {"__repr__": lambda self: "UNWANTED"})()


class NoTangent(NumformerError, RuntimeError):
    """Forward mode asked of a parameter that was given no tangent (a ``jvp`` run outside
    :func:`numformer.forward_mode.tangents`): one line saying how to give it one."""


class NoForwardMode(NumformerError, NotImplementedError):
    """A tool that needs forward mode (a JVP, an exact Hessian-vector product) was given a layer without
    ``jvp`` and ``backward_jvp`` of its own: one line naming the layer and what to write (:class:`Module`)."""


class StaleParameterArray(NumformerError):
    """A layer holds a parameter's array apart from its Parameter (see :meth:`Module.parameter_buffer`)."""


def _parameter_with_grad(data, grad) -> Parameter:
    """A Parameter of these arrays (how copies and pickles of a Parameter are rebuilt)."""
    p = Parameter(data)
    p.grad = grad
    return p


class Module:
    """Base class of every layer: parameters, children, train/eval, state dicts, and the layer contract.

    Subclasses implement ``forward(...)`` and ``backward(dy)`` (returning input gradients and adding
    parameter gradients into ``Parameter.grad``). Arrays that are not trained but must move with the model
    (the positional table) are registered with :meth:`register_buffer`; a *persistent* buffer (Marian's
    frozen logits bias, ``final_logits_bias``) is also saved and loaded with the weights.

    **What a layer keeps, and who may watch it.** In training mode a forward keeps what its backward needs
    with :meth:`save_for_backward` (``self.save_for_backward(x=x)``), by name; the backward takes it back
    with :meth:`pop_saved`, which frees it; in eval mode nothing is kept (decoding holds no activations).
    Anyone may read what a layer holds through :attr:`saved` (a read-only view: ``linear.saved["x"]``),
    and each layer's docstring names its saved tensors: they are its public contract, not a private
    detail. A tool that must observe or change what a layer does (per-sentence statistics, the Hessian's
    held ReLU sets, the studies) installs a *tap* for the length of a ``with`` block (:meth:`tap`); no tool
    replaces a layer's methods, and the tap mechanism needs nothing of a layer's class, so a layer written
    later is observable by every tool (and an untapped layer is called without a wrapper).

    **Kinks, declared.** A layer says whether its forward is smooth with the class attribute :attr:`kinks`,
    because the tools that differentiate through it cannot find out by themselves: the Hessian-vector
    products (numformer/curvature/hvp.py) are a difference of gradients, which a kink (ReLU at 0) makes
    meaningless unless each kinked layer stays on the piece it was on at the point, and the finite-difference
    checks (numformer/finite_differences/kinks.py) must drop a probe whose two sides fall on different pieces.

    * ``kinks = None`` (Module's default): undeclared. The Hessian tools refuse a model holding a *leaf* layer
      (one without child modules) that leaves it undeclared, in one line (:class:`UndeclaredKinks`); a
      composite only composes its children unless it says otherwise. The finite-difference checks take an
      undeclared layer as smooth and say so in their report (a probe across an undeclared kink can only fail a
      right backward, never pass a wrong one).
    * ``kinks = False``: the forward is smooth (twice differentiable) everywhere; for a composite, what it
      computes itself outside its children is. Every numformer layer class but ReLU says so, the loss too;
      Dropout with its mask fixed is linear. A subclass inherits its parent's declaration.
    * ``kinks = True``: the forward is smooth piece by piece (ReLU, leaky ReLU, squared ReLU). The layer then
      provides :attr:`active_set`, the piece each element was on in the last training-mode forward (a bool
      array, the elements' shape, for two pieces; an integer array for more; None when nothing was kept), and
      :meth:`forward_on_pieces` ``(x, pieces)``: the same forward with every element held on the piece
      ``pieces`` names (an earlier ``active_set``) whatever its input is now, saving what backward needs so
      that backward is that piece's derivative (ReLU: ``y = x * pieces``). :func:`kinked_layers` checks both
      are there.

    **Forward mode: the JVP and the tangent of the backward.** Reverse mode (``backward``) carries a gradient
    from the output to the inputs; forward mode carries a *tangent*, a direction of change, from the inputs
    to the output. After a training-mode forward, with every parameter given its tangent
    (:func:`numformer.forward_mode.tangents` sets ``Parameter.tangent``):

    * ``jvp(*input_tangents)`` returns the output's tangent, the directional derivative of the forward
      ``y_dot = J_x x_dot + J_theta theta_dot`` (one input tangent per float input of ``forward``, in its order;
      the parameters' from ``Parameter.tangent``; ids and masks have none). It keeps what ``backward_jvp``
      needs with :meth:`save_tangents` (readable as :attr:`saved_tangents`, like :attr:`saved`).
    * ``backward_jvp(dy, dy_dot)`` runs the backward of ``dy`` and its tangent, Pearlmutter's R-operator: the
      derivative of the backward along the same tangents and along ``dy_dot``, the upstream gradient's. It
      returns ``(backward's result, its tangent)`` of the same structure, adds into ``Parameter.grad`` as
      backward does and into ``Parameter.grad_tangent`` the gradient's tangent. For the loss's parameters that
      is the exact Hessian-vector product ``H theta_dot`` (numformer/curvature/hvp.py), up to rounding, with no
      step to choose. A layer with kinks is differentiated on the piece its forward saw (ReLU: ``x_dot * S``),
      as the Hessian of a piecewise map is defined.

    Module's own ``jvp`` and ``backward_jvp`` refuse in one line (:class:`NoForwardMode`): a layer without them
    is never given a silent zero or a difference quotient instead; :func:`forward_mode_layers` checks a model
    before a tool starts.
    """

    kinks = None  # None: undeclared; False: smooth; True: piecewise, with active_set and forward_on_pieces
    _taps = None  # {"forward": [...], "backward": [...]} while a tap is installed on this instance

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_buffers", [])
        object.__setattr__(self, "_persistent", [])
        object.__setattr__(self, "_saved", {})
        object.__setattr__(self, "_tangents", {})

    def register_buffer(self, name: str, array, persistent: bool = False) -> None:
        """``self.name = array``, an array that is not trained: it has no gradient and is not among
        :meth:`parameters`, so the optimizer, gradient clipping and norms, the gradient statistics, the
        per-sentence gradients and the data-parallel gradient sum never see it; :meth:`to` moves it with the
        parameters.

        ``persistent``: also part of :meth:`state_dict` and :meth:`load_state_dict` under its dotted name,
        so a model file carries it (a frozen value that is not a function of the config, such as a logits
        bias learned elsewhere). Why a buffer and not a Parameter marked frozen: every consumer of
        ``parameters()`` would then have to skip it, and one that forgot would train it; the state dict is
        the one place that must see it. Not persistent (the default): rebuilt from the config, never
        saved (the sinusoid table).
        """
        setattr(self, name, array)
        self._buffers.append(name)
        if persistent:
            self._persistent.append(name)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, dy):  # pragma: no cover - abstract
        raise NotImplementedError

    def jvp(self, *tangents, **kwargs):
        """Forward mode (the class docstring): a layer provides its own; Module's refuses in one line."""
        raise NoForwardMode(_no_forward_mode(self, "jvp"))

    def backward_jvp(self, dy, dy_dot, *args):
        """The backward and its tangent (the class docstring): a layer provides its own; Module's refuses."""
        raise NoForwardMode(_no_forward_mode(self, "backward_jvp"))

    # -- traversal -----------------------------------------------------------
    def named_children(self):
        """(name, module) for each direct child, lists expanded as ``name.i``."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_modules(self, prefix: str = ""):
        """(dotted name, module) for this module ('' or ``prefix``) and every descendant, in definition order."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        """This module and all its descendants, depth first, each once."""
        seen = set()
        stack = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            stack.extend(reversed([c for _, c in m.named_children()]))

    def _named_parameters_all(self, prefix: str = ""):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child._named_parameters_all(prefix + name + ".")

    def named_parameters(self):
        """(dotted name, Parameter) pairs in definition order; a tied parameter appears once."""
        seen = set()
        out = []
        for name, p in self._named_parameters_all():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
        return out

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, persistent_only: bool = False):
        """(dotted name, array) of every buffer (only the persistent ones with ``persistent_only``), in
        definition order."""
        out = []
        for prefix, m in self.named_modules():
            names = getattr(m, "_persistent", ()) if persistent_only else getattr(m, "_buffers", ())
            out += [(f"{prefix}.{name}" if prefix else name, getattr(m, name)) for name in names]
        return out

    def named_state(self):
        """(dotted name, array) of everything a model file holds, on the model's device, not copied: every
        parameter's data, then every persistent buffer (what :meth:`state_dict` copies to the host)."""
        return [(n, p.data) for n, p in self.named_parameters()] + self.named_buffers(persistent_only=True)

    def parameter_buffer(self) -> ParameterBuffer:
        """The buffer every parameter of this module is a view into (:mod:`numformer.parameter_buffer`): one
        contiguous value array and one gradient array per dtype, in :meth:`named_parameters` order. The one
        they live in when it holds exactly them; else they are packed into a new one now (their values and
        gradients copied in). The Transformer packs itself when built and after :meth:`to`.

        A layer that kept a parameter's array in an attribute of its own (``self.w = self.weight.data`` in
        ``__init__``) would go on reading the old array while training updates the buffer: packing refuses
        that in one line naming the layer and the attribute (:class:`StaleParameterArray`)."""
        named = self.named_parameters()
        params = [p for _, p in named]
        found = ParameterBuffer.holding(params)
        if found is not None:
            return found
        old = {id(p.data): name for name, p in named}
        kept = [p.data for p in params]  # alive while the layers are searched, so no id is reused
        buffer = ParameterBuffer(params, [n for n, _ in named])
        for prefix, m in self.named_modules():
            for attr, value in vars(m).items():
                for item in (value if isinstance(value, (list, tuple)) else (value,)):
                    if id(item) in old and not isinstance(item, (Module, Parameter)):
                        raise StaleParameterArray(
                            f"{type(m).__name__} ({prefix or 'the model'}) keeps the array of parameter "
                            f"{old[id(item)]!r} in self.{attr}: the parameters now live in one buffer, so it "
                            "would read a stale copy; read it through the Parameter (self.weight.data) "
                            "where it is used instead of keeping the array")
        del kept
        return buffer

    def num_parameters(self) -> int:
        """Number of trainable scalars, each tied matrix counted once."""
        return sum(p.size for p in self.parameters())

    # -- modes and gradients -------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.zero_grad()

    def clear_cache(self) -> None:
        """Drop what every forward kept for backward (frees memory after a step)."""
        for m in self.modules():
            m.release_saved()

    # -- the layer contract: what forward keeps for backward, and taps --------
    def save_for_backward(self, **tensors) -> None:
        """Keep ``tensors`` (arrays or values, by name) for backward, in training mode only; replaces what
        an earlier forward kept (its tangents too: a new forward has had no jvp yet). In eval mode nothing is
        kept."""
        self._saved = dict(tensors) if self.training else {}
        self._tangents = {}

    @property
    def saved(self):
        """What the last training forward kept for backward, by name (a read-only mapping; empty in eval
        mode and after backward). The names are the layer's contract, listed in its docstring."""
        return MappingProxyType(self._saved)

    def pop_saved(self, *names):
        """Backward's side of :meth:`save_for_backward`: the named tensors (one name: the array itself;
        several: a tuple), and everything kept is freed. A backward without a training forward is a bug of
        the caller, said as such."""
        saved, self._saved = self._saved, {}
        return _kept(saved, names, f"{type(self).__name__}.backward without a forward in training mode before it "
                                   "(nothing saved as {!r})")

    def release_saved(self) -> None:
        """Forget what forward and jvp kept (the memory goes back)."""
        self._saved = {}
        self._tangents = {}

    def peek_saved(self, *names):
        """What a training forward kept, by name, *without* freeing it (one name: the array; several: a tuple):
        ``jvp`` reads the forward's tensors and leaves them to backward. Missing: the caller's bug, said as
        such."""
        return _kept(self._saved, names, f"{type(self).__name__}.jvp without a forward in training mode before it "
                                         "(nothing saved as {!r})")

    def save_tangents(self, **tensors) -> None:
        """``jvp``'s side of :meth:`save_for_backward`: keep the tangents of saved tensors (``x_dot``, ...) for
        ``backward_jvp``, by name, in training mode only."""
        self._tangents = dict(tensors) if self.training else {}

    @property
    def saved_tangents(self):
        """What the last jvp kept for backward_jvp, by name (read-only; the layer's docstring names them)."""
        return MappingProxyType(self._tangents)

    def pop_tangents(self, *names):
        """``backward_jvp``'s side of :meth:`save_tangents`: the named tangents (one name: the array itself;
        several: a tuple), all of them freed. None kept: the caller ran backward_jvp without a jvp."""
        kept, self._tangents = self._tangents, {}
        return _kept(kept, names, f"{type(self).__name__}.backward_jvp without a jvp after the forward before it "
                                  "(no tangent kept as {!r})")

    @contextlib.contextmanager
    def tap(self, forward=None, backward=None):
        """A context in which this layer's ``forward`` (``backward``) runs through ``forward(module, run,
        *args, **kwargs)``: ``run(*args, **kwargs)`` is the layer's own method (or the tap installed before),
        and what the tap returns is the result. A tap observes (reads ``module.saved``, the arguments, the
        result) or holds (returns something else, keeps other tensors with :meth:`save_for_backward`). Taps
        nest; the last installed runs first; each is removed at the end of its block::

            with layer.tap(backward=lambda m, run, dy: (seen.append(m.saved["x"]), run(dy))[1]):
                model.backward(dlogits)
        """
        functions = [(kind, f) for kind, f in (("forward", forward), ("backward", backward)) if f is not None]
        if self._taps is None:
            object.__setattr__(self, "_taps", {"forward": [], "backward": []})
        for kind, f in functions:
            self._taps[kind].append(f)
            # the instance's own attribute stands in front of its class's method while a tap of this kind is
            # installed: an untapped layer's calls go straight to the method, no wrapper in between
            object.__setattr__(self, kind, functools.partial(_through_taps, self, kind))
        try:
            yield self
        finally:
            for kind, f in functions:
                self._taps[kind].remove(f)
                if not self._taps[kind] and kind in vars(self):
                    object.__delattr__(self, kind)
            if not any(self._taps.values()):
                object.__setattr__(self, "_taps", None)

    # -- kinks: the pieces of a piecewise layer (see the class docstring) ----------
    @property
    def active_set(self):
        """The piece each element was on in the last training-mode forward, for a layer with ``kinks = True``
        (bool, the elements' shape, for two pieces); None here: a layer without kinks has one piece."""
        return None

    def forward_on_pieces(self, x, pieces):
        """The forward of ``x`` with every element held on the piece ``pieces`` says (an earlier
        :attr:`active_set`), saving what backward needs for that piece's derivative; a layer with
        ``kinks = True`` provides it."""
        raise NotImplementedError(f"{type(self).__name__} declares kinks = {self.kinks!r} and has no "
                                  "forward_on_pieces")

    # -- devices and dtypes --------------------------------------------------
    def to(self, xp=None, dtype=None) -> "Module":
        """Move every parameter and buffer to array module ``xp`` and/or cast to ``dtype``.

        Gradients are re-allocated as zeros; parameters that were packed in one buffer are packed in a new
        one. Returns self.
        """
        from .backend import xp_for  # noqa: PLC0415

        if isinstance(xp, str):
            xp = xp_for(xp)
        params = self.parameters()
        packed = bool(params) and ParameterBuffer.holding(params) is not None
        done = set()
        for m in self.modules():
            for p in vars(m).values():
                if isinstance(p, Parameter) and id(p) not in done:
                    done.add(id(p))
                    p.to(xp or get_array_module(p.data), dtype)
            for name in m._buffers:
                buf = getattr(m, name)
                setattr(m, name, to_xp(buf, xp or get_array_module(buf), dtype))
            if xp is not None:
                m._moved(xp)
        if packed:  # one buffer before the move, one after (on the new device, in the new dtype)
            self.parameter_buffer()
        return self

    def _moved(self, xp) -> None:
        """Hook for modules holding device state other than arrays (the dropout RNG); called on a device move."""

    # -- state dicts ---------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Parameter (then persistent buffer) name -> host numpy array copy (portable: loads without cupy)."""
        return OrderedDict((n, np.array(to_host(a))) for n, a in self.named_state())

    def load_state_dict(self, state, strict: bool = True) -> None:
        """Copy arrays into the parameters and persistent buffers, keeping each one's device and dtype.

        With ``strict`` every name must be present and no extra names allowed;
        shapes must always match. Errors are ValueError with one line naming the tensor.
        """
        params = dict(self.named_state())
        if strict:
            missing = [n for n in params if n not in state]
            extra = [n for n in state if n not in params]
            if missing or extra:
                raise ValueError(
                    f"state dict does not match the model: missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                    f"unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}"
                )
        for name, target in params.items():
            if name not in state:
                continue
            value = state[name]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"shape mismatch for {name}: checkpoint {tuple(value.shape)}, model {tuple(target.shape)}")
            target[...] = to_xp(value, get_array_module(target), target.dtype)  # in place: the array the layer holds


def _kept(store: dict, names, missing: str):
    """``store``'s values of ``names`` (one name: the value itself; several: a tuple); the first name missing is
    the caller's bug, a RuntimeError of ``missing`` with that name."""
    absent = [n for n in names if n not in store]
    if absent:
        raise RuntimeError(missing.format(absent[0]))
    return store[names[0]] if len(names) == 1 else tuple(store[n] for n in names)


def _no_forward_mode(layer, method: str) -> str:
    return (f"{type(layer).__name__} has no {method} of its own: forward mode (JVPs, exact Hessian-vector "
            "products) needs jvp(*input_tangents) and backward_jvp(dy, dy_dot) beside forward and backward "
            "(numformer/module.py's Module says what each returns)")


def lacks_forward_mode(layer) -> list:
    """The forward-mode methods ``layer`` (or a layer class) has not of its own: ``jvp`` and ``backward_jvp``
    (Module's refuse; an object that is no Module needs both callable), empty when it has both."""
    cls = layer if isinstance(layer, type) else type(layer)
    return [f for f in ("jvp", "backward_jvp") if not callable(getattr(cls, f, None))
            or getattr(cls, f) is getattr(Module, f)]


def forward_mode_layers(model, tool: str) -> None:
    """Refuse, in one line naming the first, a model holding a layer without its own ``jvp`` and
    ``backward_jvp`` (:class:`NoForwardMode`), before ``tool`` (named in the message) starts: a composite needs
    them too, since it composes its children's."""
    for name, m in model.named_modules():
        lacking = lacks_forward_mode(m)
        if lacking:
            raise NoForwardMode(f"{tool} need forward mode and {type(m).__name__} ({name or 'the model'}) has no "
                                f"{lacking[0]} of its own: write jvp(*input_tangents) and backward_jvp(dy, dy_dot) "
                                "beside its forward and backward (numformer/module.py's Module), or use the "
                                "differences of gradients (method='differences')")


class UndeclaredKinks(NumformerError, ValueError):
    """A tool that needs to know a layer's kinks was given a layer that does not declare them (or declares
    ``kinks = True`` without the pieces): one line naming the layer and what to write
    (:attr:`Module.kinks`). Also a ValueError."""


def _declares_pieces(layer) -> bool:
    """An ``active_set`` and a ``forward_on_pieces`` of the layer's own (a Module's, not Module's placeholders)."""
    if not isinstance(layer, Module):
        return hasattr(layer, "forward_on_pieces") and hasattr(layer, "active_set")
    cls = type(layer)
    return all(getattr(cls, name, None) is not getattr(Module, name) or name in vars(layer)
               for name in ("active_set", "forward_on_pieces"))


def _has_children(layer) -> bool:
    return isinstance(layer, Module) and next(iter(layer.named_children()), None) is not None


def kink_declarations(modules) -> tuple[list, list]:
    """``modules``: (name, layer) pairs (``named_modules()``; a layer need not be a Module, its ``kinks``
    attribute is read). -> (the layers declaring ``kinks = True``, the names of the *leaf* layers that leave
    ``kinks`` undeclared). A layer declaring ``kinks = True`` without ``active_set`` and ``forward_on_pieces``
    is refused here, in one line (:class:`UndeclaredKinks`)."""
    kinked, undeclared = [], []
    for name, m in modules:
        kinks = getattr(m, "kinks", None)
        if kinks is True:
            if not _declares_pieces(m):
                raise UndeclaredKinks(
                    f"{type(m).__name__} ({name or 'the layer'}) declares kinks = True but does not provide its "
                    "pieces: give it an active_set property (the piece each element was on in the last training "
                    "forward) and forward_on_pieces(x, pieces) (the forward held on those pieces), see "
                    "numformer/module.py's Module")
            kinked.append(m)
        elif kinks is None and not _has_children(m):
            undeclared.append(f"{type(m).__name__} ({name})" if name else type(m).__name__)
    return kinked, undeclared


def kinked_layers(model, tool: str) -> list:
    """The layers of ``model`` declaring ``kinks = True`` (each with its pieces), for ``tool`` (named in the
    message), which needs every kink declared: a leaf layer leaving :attr:`Module.kinks` undeclared is refused
    in one line (:class:`UndeclaredKinks`), as is one declaring kinks without its pieces."""
    kinked, undeclared = kink_declarations(model.named_modules())
    if undeclared:
        raise UndeclaredKinks(
            f"{tool} need to know every layer's kinks and {undeclared[0]}"
            f"{f' (and {len(undeclared) - 1} more)' if len(undeclared) > 1 else ''} does not declare them: set "
            "kinks = False on its class if its forward is smooth, or kinks = True with active_set and "
            "forward_on_pieces if it is piecewise (numformer/module.py's Module)")
    return kinked


@contextlib.contextmanager
def tapped(modules, forward=None, backward=None):
    """:meth:`Module.tap` on each of ``modules`` at once (the same ``forward`` and ``backward`` taps), all of
    them installed on entering the block and removed at its end, an exception included::

        with tapped([m for m in model.modules() if m.kinks], forward=record):
            model(src, tgt_in)
    """
    with contextlib.ExitStack() as taps:
        for m in modules:
            taps.enter_context(m.tap(forward=forward, backward=backward))
        yield


def _through_taps(module, kind: str, *args, **kwargs):
    """``module.forward(...)`` (``kind``: or backward) while a tap of that kind is installed on it: its class's
    method run through the taps, the first installed innermost. A subclass calling ``super().forward`` reaches
    its parent's method directly, so a layer is tapped once, at the level the caller called."""
    call = getattr(type(module), kind).__get__(module)
    for tap in module._taps[kind]:
        call = functools.partial(tap, module, call)
    return call(*args, **kwargs)
