"""The check of any layer: :func:`check` (``check(layer, *inputs)``) runs the finite-difference check of
:func:`~numformer.finite_differences.central_differences.run_case` on any object with the layer contract, a user's
own layer included, and returns a printable :class:`CheckReport`.

The layer is checked as a float64 copy (:func:`detached_copy`), its parameters found however it keeps
them, its dropout generators replayed so every forward draws the same mask. What a layer does wrong
before any number can be compared (a gradient per input missing, a wrong shape, NaN) is a
:class:`LayerContractError`, reported in one line (:func:`validate_gradients`); the exercises' grading
(``python -m grad_checks``) uses the same pieces on a student's backward.
"""
from __future__ import annotations

import copy
import inspect
import sys
from dataclasses import dataclass, field

import numpy as np

from ..backend import RandomState
from ..module import UndeclaredKinks, lacks_forward_mode
from ..user_code import exception_line
from .central_differences import GradCase, analytic_gradients, format_results, run_case
from .kinks import undeclared

@dataclass
class CheckReport:
    """What :func:`check` found: one :class:`TensorResult` per tensor, or the one line that stopped it.

    ``passed`` is true when the layer ran and every tensor is within the tolerance. ``print(report)``
    shows a table: tensor, shape, probes measured, probes dropped at kinks, worst relative error.
    """

    layer: str
    results: list = field(default_factory=list)
    error: str | None = None      # the layer raised, or its gradients have the wrong shape, NaN, ...
    notes: list = field(default_factory=list)
    tolerance: float = 1e-6
    step: float = 1e-5

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.results) and all(r.passed for r in self.results)

    @property
    def failed(self) -> list:
        return [r for r in self.results if not r.passed]

    def __str__(self) -> str:
        head = f"check({self.layer}): float64 central differences, step {self.step:.0e}, tolerance {self.tolerance:.0e}"
        lines = [head] + [f"  note: {n}" for n in self.notes]
        if self.error is not None:
            return "\n".join(lines + [f"  FAILED: {self.error}"])
        lines.append(format_results(self.results, indent="  "))
        worst = max((r.max_rel_error for r in self.results), default=0.0)
        verdict = "passed" if self.passed else f"FAILED ({len(self.failed)} of {len(self.results)} tensors)"
        lines.append(f"  {verdict}: {len(self.results)} tensors, worst relative error {worst:.2e}")
        return "\n".join(lines)

    __repr__ = __str__


def _is_float_array(value) -> bool:
    return isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)


def _find_parameters(layer) -> list:
    """(name, parameter) of a layer: ``named_parameters()``, else ``parameters()``, else the attributes
    that look like parameters (an array ``.data`` and ``.grad``)."""
    if hasattr(layer, "named_parameters"):
        return list(layer.named_parameters())
    if hasattr(layer, "parameters"):
        return [(f"param{i}", p) for i, p in enumerate(layer.parameters())]
    return [(name, v) for name, v in vars(layer).items()
            if isinstance(getattr(v, "data", None), np.ndarray) and hasattr(v, "grad")]


def _generators(layer) -> list:
    """Random generators the layer draws from (dropout): restored before every forward so masks repeat."""
    owners = list(layer.modules()) if hasattr(layer, "modules") else [layer]
    found, seen = [], set()
    for owner in owners:
        for value in vars(owner).values():
            if isinstance(value, (RandomState, np.random.Generator)) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
    return found


def _replayer(generators):
    """A before_forward hook restoring every generator to its present state."""
    states = [(g, g.get_state() if hasattr(g, "get_state") else g.bit_generator.state) for g in generators]

    def restore():
        for g, s in states:
            if hasattr(g, "set_state"):
                g.set_state(s)
            else:
                g.bit_generator.state = s
    return restore


class _Foreign:
    """Presents a layer that is not a numformer Module (a student's own class) to :func:`run_case`."""

    def __init__(self, layer, params):
        self.layer, self.params = layer, params

    def named_parameters(self):
        return list(self.params)

    def zero_grad(self):
        for _, p in self.params:
            p.grad[...] = 0

    def train(self, mode: bool = True):
        if hasattr(self.layer, "train"):
            self.layer.train(mode)
        return self

    def clear_cache(self):
        if hasattr(self.layer, "clear_cache"):
            self.layer.clear_cache()

    def modules(self):
        """The layer's modules, or the layer alone (so a ``kinks`` it declares is seen)."""
        return self.layer.modules() if hasattr(self.layer, "modules") else iter((self.layer,))


def detached_copy(obj):
    """A deep copy of ``obj`` (a layer, the arguments of a call) that shares modules instead of copying
    them (a RandomState holds its array module, ``numpy``, which cannot be copied)."""
    return copy.deepcopy(obj, {id(m): m for m in list(sys.modules.values())})


def _float64_twin(layer, notes):
    """A float64 deep copy of ``layer`` (the check must not touch the caller's layer or its .grad)."""
    try:
        twin = detached_copy(layer)
    except Exception:  # noqa: BLE001  (an uncopyable layer: checked in place)
        twin = layer
        notes.append("the layer could not be copied: it was checked in place (its .grad arrays were used)")
    params = _find_parameters(twin)
    if any(p.data.dtype != np.float64 for _, p in params):
        notes.append("parameters cast to float64 in a copy of the layer (finite differences need float64)")
        if hasattr(twin, "to") and hasattr(twin, "modules"):
            twin.to(dtype=np.float64)
        else:
            for _, p in params:
                p.data = p.data.astype(np.float64)
                p.grad = np.zeros_like(p.data)
    for _, p in _find_parameters(twin):
        if getattr(p, "grad", None) is None or np.shape(p.grad) != np.shape(p.data):
            p.grad = np.zeros_like(p.data)
    return twin


def _takes_no_upstream(backward) -> bool:
    """A loss: its backward takes no argument (the upstream gradient of a scalar loss is 1)."""
    try:
        params = inspect.signature(backward).parameters.values()
    except (TypeError, ValueError):
        return False
    return not [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _input_names(forward, n: int) -> list:
    """The names of forward's first ``n`` positional parameters (``x``, ``memory``), ``argI`` where unknown."""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [params[i].name if i < len(params) and params[i].kind in positional else f"arg{i}" for i in range(n)]


class LayerContractError(Exception):
    """A layer broke the contract check() relies on (wrong number of gradients, a wrong shape, NaN)."""


def _gradients_by_input(result, names, who) -> dict:
    """Match backward's return value to the float inputs: one array, a tuple of them, or None (no input
    gradient, e.g. token ids)."""
    if result is None:
        grads = []
    elif isinstance(result, (tuple, list)):
        grads = list(result)
    else:
        grads = [result]
    if len(grads) != len(names):
        what = "None" if result is None else f"{len(grads)} gradient{'s' * (len(grads) != 1)}"
        raise LayerContractError(f"{who}.backward returned {what} for {len(names)} float input"
                                 f"{'s' * (len(names) != 1)} ({', '.join(names) or 'none'}): it must return one "
                                 "gradient per float input, in their order")
    out = {}
    for name, g in zip(names, grads):
        if g is None:
            continue
        out[name] = np.asarray(g)
    return out


def validate_gradients(tensors, who: str) -> None:
    """Raise LayerContractError, in one line, for a gradient of the wrong shape or with NaN/inf."""
    for name, x, g in tensors:
        if g.shape != np.shape(x):
            raise LayerContractError(f"the gradient of {name} has shape {g.shape}, expected {np.shape(x)}"
                                     + (" (transposed?)" if g.shape == np.shape(x)[::-1] else ""))
        bad = ~np.isfinite(g)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise LayerContractError(f"the gradient of {name} holds NaN or inf at {first} "
                                     f"({int(bad.sum())} of {g.size} entries)")


def check(layer, *inputs, seed: int = 0, step: float = 1e-5, tolerance: float = 1e-6, **kwargs) -> CheckReport:
    """Check ``layer``'s backward against float64 central differences; returns a printable report.

    ``layer``: any object with the layer contract: ``forward(*inputs, **kwargs)`` returns an array
    or a tuple of arrays and caches what backward needs; ``backward(*upstream)``
    returns the gradient of each float input, in their order (one array, a tuple, or None when
    there is none, e.g. token ids) and *adds* the parameter gradients into ``.grad``. Parameters
    are found by ``named_parameters()``, ``parameters()`` or as attributes with ``.data`` and
    ``.grad``. A layer whose backward takes no argument is a loss: forward returns a scalar and
    backward its gradient for an upstream of 1 (numformer's LabelSmoothedCrossEntropy).

    ``inputs`` (and ``kwargs``): float arrays are checked, every entry of a small one and a sample
    of entries plus random directions of a large one (:func:`run_case`); anything else (integer
    ids, boolean masks, a sub-layer) is passed to forward unchanged. The upstream gradients are
    random (seeded by ``seed``), dropout generators found on the layer are replayed so every
    forward draws the same mask, and a probe that straddles a kink is dropped and replaced: the kinks
    a layer declares (``kinks = True`` with its pieces, :class:`numformer.module.Module`); a leaf layer
    that declares nothing is checked as smooth and named in the report's notes. A probe that fails at
    ``step`` is measured again at ``step / 2`` and judged by Richardson's extrapolation (run_case).
    The layer is checked as a float64 copy: the caller's layer and its ``.grad`` are not touched.

    Forward mode: a layer with ``jvp`` and ``backward_jvp`` of its own (the layer contract,
    :class:`numformer.module.Module`; float inputs given by position) gets their rows too, the JVP against
    central differences of its forward and the backward's tangent against central differences of its backward
    (numformer.finite_differences.tangent_checks); a layer without them is named in the notes (exact
    Hessian-vector products refuse a model holding it).

        >>> report = check(LayerNorm(8), np.random.default_rng(0).standard_normal((2, 3, 8)))
        >>> report.passed
        True
    """
    who = type(layer).__name__
    notes: list = []
    twin = _float64_twin(layer, notes)
    names = _input_names(twin.forward, len(inputs))
    args, values, float_names = list(inputs), {}, []
    for i, (name, value) in enumerate(zip(names, inputs)):
        if _is_float_array(value):
            if value.dtype != np.float64:
                notes.append(f"input {name} cast to float64")
            args[i] = values[name] = np.array(value, dtype=np.float64, order="C")
            float_names.append(name)
    kw = dict(kwargs)
    for name, value in kwargs.items():
        if _is_float_array(value):
            kw[name] = values[name] = np.array(value, dtype=np.float64, order="C")
            float_names.append(name)
    loss = _takes_no_upstream(twin.backward)

    def fwd(m, i):  # the arrays in ``i`` are those in args and kw: run_case perturbs them in place
        out = twin.forward(*args, **kw)
        return out * 1.0 if loss else out  # a 0-d loss array becomes a float64 scalar

    def bwd(m, g):
        if loss:
            result = twin.backward()
            result = tuple(r * g[0] for r in result) if isinstance(result, tuple) else (
                None if result is None else result * g[0])
        else:
            result = twin.backward(*g)
        return _gradients_by_input(result, float_names, who)

    module = twin if hasattr(twin, "modules") and hasattr(twin, "clear_cache") else _Foreign(twin, _find_parameters(twin))
    try:  # the kinks it declares (Module.kinks); a leaf that declares none is checked as smooth, and named
        named = twin.named_modules() if hasattr(twin, "named_modules") else [("", twin)]
        smooth = undeclared(named)
    except UndeclaredKinks as exc:  # kinks = True without its pieces
        return CheckReport(who, error=str(exc), notes=notes, tolerance=tolerance, step=step)
    if smooth:
        notes.append(f"{', '.join(smooth)} declare{'s' * (len(smooth) == 1)} no kinks: checked as smooth (a layer "
                     "with kinks says kinks = True and gives its pieces: numformer.module.Module.kinks)")
    gens = _generators(twin)
    case = GradCase(who, "check", module, values, fwd, bwd, before_forward=_replayer(gens) if gens else None)
    report = CheckReport(who, notes=notes, tolerance=tolerance, step=step)
    try:  # one trial run: the layer's own errors become one line, not a traceback from the checker
        _, tensors = analytic_gradients(case, np.random.default_rng(seed))
        validate_gradients(tensors, who)
    except LayerContractError as exc:
        report.error = str(exc)
        return report
    except Exception as exc:  # noqa: BLE001  (whatever the user's layer raises)
        report.error = ("not implemented yet: " if isinstance(exc, NotImplementedError) else "the layer raised ") + \
            exception_line(exc)
        return report
    if not tensors:
        report.error = "nothing to check: the layer has no parameters and no float input"
        return report
    report.results = run_case(case, np.random.default_rng(seed), h=step, tolerance=tolerance)
    report.results += _forward_mode(twin, module, case, float_names,
                                    any(_is_float_array(v) for v in kwargs.values()), loss, notes, seed)
    return report


def _forward_mode(twin, module, case, float_names, float_kwargs: bool, loss: bool, notes, seed) -> list:
    """The forward-mode rows of :func:`check` (numformer.finite_differences.tangent_checks) when the layer has
    ``jvp`` and ``backward_jvp`` of its own, else none and a note saying what that means: exact Hessian-vector
    products (numformer/curvature/hvp.py) refuse a model holding it."""
    own = not lacks_forward_mode(twin)
    if own and not all(hasattr(p, "set_tangents") for _, p in module.named_parameters()):
        notes.append("forward mode not checked: its parameters are not numformer Parameters (numformer.module."
                     "Parameter holds the tangents a jvp reads)")
        return []
    if not own:
        notes.append("no forward mode (jvp and backward_jvp of its own): not checked; exact Hessian-vector products "
                     "refuse a model holding this layer (numformer.module.Module says what to write)")
        return []
    if float_kwargs:
        notes.append("forward mode not checked: a float input given by keyword (give float inputs by position)")
        return []
    from .tangent_checks import STEP, TOLERANCE, run_tangent_case  # noqa: PLC0415

    def jvp(m, t):
        out = twin.jvp(*(t[n] for n in float_names))
        return out * 1.0 if loss else out

    def backward_jvp(m, g, g_dot):
        if loss:  # the upstream of a scalar loss is a number g: the gradient is dz * g, its tangent dz_dot * g + dz * g_dot
            dz, dz_dot = twin.backward_jvp()
            dz, dz_dot = (dz, dz_dot) if isinstance(dz, tuple) else ((dz,), (dz_dot,))
            result = tuple(r * g[0] for r in dz)
            dots = tuple(d * g[0] + r * g_dot[0] for d, r in zip(dz_dot, dz))
        else:
            result, dots = twin.backward_jvp(*g, *g_dot)
        return (_gradients_by_input(result, float_names, type(twin).__name__),
                _gradients_by_input(dots, float_names, type(twin).__name__))
    notes.append(f"forward mode: jvp against differences of forward, backward_jvp against differences of "
                 f"backward (step {STEP:.0e}, Romberg's extrapolation, tolerance {TOLERANCE:.0e})")
    tangent_case = GradCase(case.layer, case.case, module, case.inputs, case.forward, case.backward,
                            before_forward=case.before_forward, jvp=jvp, backward_jvp=backward_jvp)
    return run_tangent_case(tangent_case, np.random.default_rng(seed))
