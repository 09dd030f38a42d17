"""One buffer for all parameters: every weight a view into one array, every gradient a view into another.

llm.c's layout (``params_memory``, ``grads_memory``): the parameters of a model are laid end to end in one
contiguous 1-D array per (device, dtype), and their gradients in a second array of the same layout. Each
:class:`~numformer.module.Parameter`'s ``data`` and ``grad`` are reshaped views into them, so

* a layer reads and writes its weight and gradient exactly as before (``p.grad += ...``, ``p.data[...] = ...``
  go to the buffer; nothing about a layer changes);
* whatever works on *all* parameters at once, Adam (Section 5.3), the gradient norm and clipping, zeroing,
  loss scaling and the data-parallel all-reduce, is a few operations on whole buffers instead of a few
  per tensor (253 tensors in base: on a GPU each was a handful of kernel launches).

Layout of one group (one dtype on one device), ``n`` elements::

    data  [ p0 ......| gap | p1 ...| gap | ... | p_last ... | gap ]      (n,)
    grad  [ the same offsets                                      ] + [spare, spare]   (n + SPARE_SLOTS,)

Each tensor starts at a multiple of :data:`ALIGN` elements (64 bytes in float32: a cache line, and whole
vector loads for a fused GPU kernel); the gaps hold zeros, whose Adam update is zero, so whole-buffer
operations need no mask. The gradient array ends with :data:`SPARE_SLOTS` elements beyond ``grad`` where a
step's loss and NLL ride along in the one all-reduce of several processes.

Who makes one: :meth:`numformer.module.Module.parameter_buffer` (the Transformer calls it when it is built
and after ``Module.to``; loading a checkpoint writes into the views in place), and
:class:`numformer.optim.Adam` for the parameters it is given, through :meth:`ParameterBuffer.of`, which
returns the buffer the parameters already live in when it holds exactly them. A parameter knows its buffer
(``p.packed_in``); a copy of a parameter (``copy.deepcopy``, pickle) is a parameter of its own, outside any
buffer, until a buffer is made for it.

A layer must never rebind its parameter's arrays (``p.data = new`` instead of ``p.data[...] = new``): the
buffer would keep updating the old memory. :meth:`ParameterBuffer.check` (called by every Adam step) turns
that into an error naming the parameter instead of a silent non-update.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backend import get_array_module

ALIGN = 16        # every tensor starts at a multiple of 16 elements (64 bytes in float32)
SPARE_SLOTS = 2   # the step's loss and NLL, summed with the gradients in one all-reduce


class ParameterRebound(RuntimeError):
    """A parameter's ``data`` or ``grad`` is no longer the view the buffer gave it: a bug of the code that
    rebound it (not a user's mistake, hence not a NumformerError)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class ParameterGroup:
    """The parameters of one dtype on one device: their values end to end in ``data`` (n,), their gradients
    at the same offsets in ``grad`` (n,), a view of ``grad_and_spare`` (n + SPARE_SLOTS,)."""

    xp: object
    data: object
    grad_and_spare: object
    params: list = field(default_factory=list)
    offsets: list = field(default_factory=list)   # element offset of each parameter in data and grad
    data_views: list = field(default_factory=list)
    grad_views: list = field(default_factory=list)

    @property
    def grad(self):
        return self.grad_and_spare[:self.data.size]

    @property
    def spare(self):
        return self.grad_and_spare[self.data.size:]

    def views(self, flat) -> list:
        """Per parameter, its view into ``flat``, an array of this group's layout (Adam's moments)."""
        return [flat[o:o + p.size].reshape(p.shape) for p, o in zip(self.params, self.offsets)]


class ParameterBuffer:
    """``params`` (Parameters, each once) packed into one data and one gradient array per (device, dtype).

    Packing copies each parameter's current value and gradient into the buffer and makes ``p.data`` and
    ``p.grad`` views into it (the old arrays are let go). ``names``: what :meth:`check` calls each parameter
    (default: ``parameter I``, its index).
    """

    def __init__(self, params, names=None):
        self.params = list(params)
        self.names = list(names) if names is not None else [f"parameter {i}" for i in range(len(self.params))]
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter is listed twice: a tied weight is one Parameter, listed once")
        by_kind: dict = {}
        for p in self.params:  # groups in the order their first parameter comes
            xp = get_array_module(p.data)
            by_kind.setdefault((id(xp), str(p.data.dtype)), []).append(p)
        self.groups = [self._pack(members) for members in by_kind.values()]

    def _pack(self, params) -> ParameterGroup:
        xp, dtype = get_array_module(params[0].data), params[0].data.dtype
        offsets, n = [], 0
        for p in params:
            offsets.append(n)
            n += _aligned(p.size)
        group = ParameterGroup(xp, xp.zeros(n, dtype=dtype), xp.zeros(n + SPARE_SLOTS, dtype=dtype),
                               params, offsets)
        group.data_views, group.grad_views = group.views(group.data), group.views(group.grad)
        for p, d, g in zip(params, group.data_views, group.grad_views):
            d[...] = p.data
            g[...] = p.grad
            p.data, p.grad, p.packed_in = d, g, self
        return group

    @staticmethod
    def holding(params) -> "ParameterBuffer | None":
        """The buffer that holds exactly ``params``, in this order, every view in place; None if there is none."""
        params = list(params)
        home = params[0].packed_in if params else None
        if home is not None and len(home.params) == len(params) and all(a is b for a, b in zip(home.params, params)) \
                and home.intact():
            return home
        return None

    @classmethod
    def of(cls, params, names=None) -> "ParameterBuffer":
        """The buffer ``params`` live in (:meth:`holding`), else a new one packing them."""
        params = list(params)
        return cls.holding(params) or cls(params, names)

    # -- whole-buffer views --------------------------------------------------------------------------
    @property
    def data(self) -> list:
        """The value arrays, one per group (usually one)."""
        return [g.data for g in self.groups]

    @property
    def grads(self) -> list:
        """The gradient arrays, one per group, each of its group's ``data`` layout."""
        return [g.grad for g in self.groups]

    def zeros(self) -> list:
        """New arrays of the groups' layouts, zero (Adam's moments)."""
        return [g.xp.zeros_like(g.data) for g in self.groups]

    def views(self, flats) -> list:
        """Per parameter (in ``params`` order), its view into ``flats`` (arrays of the groups' layouts)."""
        by_param = {}
        for g, flat in zip(self.groups, flats):
            by_param.update((id(p), v) for p, v in zip(g.params, g.views(flat)))
        return [by_param[id(p)] for p in self.params]

    def zero_grad(self) -> None:
        for g in self.groups:
            g.grad_and_spare.fill(0)

    # -- the views still in place ---------------------------------------------------------------------
    def intact(self) -> bool:
        """True while every parameter's ``data`` and ``grad`` are still this buffer's views."""
        return self._first_rebound() is None

    def check(self) -> None:
        """Raise :class:`ParameterRebound` naming the first parameter whose arrays are no longer the buffer's."""
        bad = self._first_rebound()
        if bad is not None:
            name, what = bad
            raise ParameterRebound(
                f"{name}'s {what} is not its view into the parameter buffer any more: some code assigned a new "
                f"array to it (p.{what} = ...) instead of writing into it (p.{what}[...] = ...), so the optimizer "
                "would update memory the model no longer reads; this is a bug of that code (or the model was "
                "moved or cast after the optimizer was built: build the optimizer after Module.to)")

    def _first_rebound(self):
        for g in self.groups:
            for p, d, gr in zip(g.params, g.data_views, g.grad_views):
                if p.packed_in is not self or p.data is not d:
                    return self.names[self._index(p)], "data"
                if p.grad is not gr:
                    return self.names[self._index(p)], "grad"
        return None

    def _index(self, p) -> int:
        return next(i for i, q in enumerate(self.params) if q is p)

    def __repr__(self) -> str:
        kinds = ", ".join(f"{g.data.size:,} {g.data.dtype} on {'the host' if g.xp is np else 'the device'}"
                          for g in self.groups)
        return f"ParameterBuffer({len(self.params)} parameters: {kinds})"


def gradient_arrays(params) -> list:
    """The arrays holding the gradients of ``params``: a :class:`ParameterBuffer`'s whole gradient arrays
    (a few operations for every gradient), or each Parameter's ``grad`` of a list (one per tensor)."""
    if isinstance(params, ParameterBuffer):
        return params.grads
    return [p.grad for p in params]
