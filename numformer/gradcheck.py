"""Finite-difference gradient checks, shared by ``python -m grad_checks`` and the tests.

The scalar checked is ``L = sum_i <out_i, G_i>`` with random upstream gradients G
(never all-ones: ones hide bugs in attention). For each tensor (parameters and
float inputs) the analytic gradient from ``backward`` is compared with central
differences in float64::

    dL/dx[i] ~ (L(x + h e_i) - L(x - h e_i)) / 2h

on every entry of a small tensor, or on a random sample of entries of a large
one plus a few random +-1 directions u (``<grad, u>`` against
``(L(x + h u) - L(x - h u)) / 2h``, Chainer's idea: two forwards per direction
cover every entry at once). The error is ``|a - n| / max(|a| + |n|, tiny)``, the
worst over the probes of a tensor is reported.

Step h = 1e-5 by default. Central differences have truncation error O(h^2 L''')
and round-off O(eps_64 * |L| / h); the step that balances them is about
eps_64^(1/3) ~ 6e-6. Measured on these checks: h = 1e-6 leaves round-off of
~3e-11 in the full model's derivatives, h = 1e-5 ten times less, with truncation
still below 1e-10 relative.

Floor of the denominator: ``tiny = floor_ratio * max|analytic gradient|`` over the
whole case (floor_ratio 1e-3). Some gradients are exactly zero by symmetry (the
key bias: softmax is invariant to a shift of a whole row of scores), and entries
1000x smaller than the case's largest are at round-off level; a plain relative
error of two round-off-sized numbers is ~1 and says nothing. With the floor,
such entries must agree to ``tolerance * tiny`` in absolute terms instead.

Kinks: ReLU is not differentiable at 0. When the +h and -h evaluations of a
probe see different ReLU active sets, the difference quotient straddles a kink
and measures nothing; such a probe is dropped (counted in ``kinks``, reported)
and, for a sampled tensor or a direction, another entry or direction is drawn in
its place (up to four times the number asked for). A tensor none of whose probes
could be measured fails: no evidence is not a pass.

:func:`check` (``check(layer, *inputs)``) runs the same check on any object with the layer
contract, a user's own layer included, and returns a printable :class:`CheckReport`; the
exercises (``python -m grad_checks exercise``) grade students' backward passes with it and
with :func:`analytic_gradients`, the one forward and backward both checks start from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

TINY = 1e-8  # below this |a| + |n|, both gradients are zero to round-off: the error is measured against TINY


@dataclass
class TensorResult:
    """The outcome for one tensor of one check."""

    layer: str
    case: str
    tensor: str
    shape: tuple
    probes: int
    max_rel_error: float
    tolerance: float
    samples: list = field(default_factory=list)  # (probe, analytic, numeric, rel_error) for --verbose
    kinks: int = 0  # probes dropped because +h and -h gave different ReLU active sets

    @property
    def passed(self) -> bool:
        """At least one probe measured, and the worst within the tolerance."""
        return bool(self.probes > 0 and self.max_rel_error <= self.tolerance)


def rel_error(a: float, n: float, tiny: float = TINY) -> float:
    """``|a - n| / max(|a| + |n|, tiny)``."""
    return abs(a - n) / max(abs(a) + abs(n), tiny)


@dataclass
class GradCase:
    """One gradient check: a module, its float inputs, and how to run it forward and backward.

    forward(module, inputs) -> array or tuple of arrays (the outputs);
    backward(module, upstream) -> dict input-name -> gradient (upstream: list of arrays matching outputs);
    before_forward(): called before every forward (e.g. restore the dropout RNG so masks repeat).
    params: name -> Parameter to check (default: module.named_parameters()).
    """

    layer: str
    case: str
    module: object
    inputs: dict
    forward: Callable
    backward: Callable
    before_forward: Callable | None = None
    params: dict | None = None


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def analytic_gradients(case: GradCase, rng: np.random.Generator) -> tuple[list, list]:
    """One forward and backward of ``case`` with random upstream gradients drawn from ``rng``.

    -> (upstream, tensors): the upstream gradients (one per output) and, for every parameter
    then every input with a gradient, ``(name, the array itself, a copy of its analytic gradient)``;
    inputs are named ``input:NAME``. The same ``rng`` state gives the same upstream gradients,
    so two versions of a layer built alike can be compared tensor by tensor.
    """
    module = case.module
    module.train()
    if case.before_forward is not None:
        case.before_forward()
    outs = _as_tuple(case.forward(module, case.inputs))
    upstream = [rng.standard_normal(np.shape(o)) for o in outs]
    module.zero_grad()
    input_grads = case.backward(module, upstream)
    params = case.params if case.params is not None else dict(module.named_parameters())
    tensors = [(name, p.data, np.array(p.grad)) for name, p in params.items()]
    tensors += [(f"input:{name}", case.inputs[name], np.asarray(g)) for name, g in input_grads.items()]
    return upstream, tensors


def run_case(case: GradCase, rng: np.random.Generator, h: float = 1e-5, full_size: int = 64,
             sample: int = 8, directions: int = 3, tolerance: float = 1e-6,
             keep_samples: int = 0, floor_ratio: float = 1e-3) -> list[TensorResult]:
    """Check every parameter and input tensor of ``case``; returns one TensorResult per tensor."""
    module = case.module
    upstream, tensors = analytic_gradients(case, rng)

    def objective(upstream):
        """(L, kink signature): the signature is the ReLU active set of this forward."""
        if case.before_forward is not None:
            case.before_forward()
        outs = _as_tuple(case.forward(module, case.inputs))
        signature = hash(b"".join(np.packbits(m._cache_positive).tobytes()
                                  for m in module.modules() if getattr(m, "_cache_positive", None) is not None))
        module.clear_cache()
        return float(sum(np.sum(o * g) for o, g in zip(outs, upstream))), signature

    def central_difference(perturb, restore):
        """(L(x + h d) - L(x - h d)) / 2h, or None when the two sides straddle a ReLU kink."""
        perturb(+h)
        lp, sp = objective(upstream)
        perturb(-h)
        lm, sm = objective(upstream)
        restore()
        return None if sp != sm else (lp - lm) / (2 * h)


    # The floor of the error's denominator: a fraction of the largest gradient entry of the case.
    gmax = max([float(np.abs(g).max()) for _, _, g in tensors if g.size] + [0.0])
    tiny = max(floor_ratio * gmax, TINY)
    results = []
    for name, x, grad in tensors:
        if grad.shape != x.shape:
            raise AssertionError(f"{case.layer}/{case.case}: gradient of {name} has shape {grad.shape}, expected {x.shape}")
        probes = []
        if not x.flags.c_contiguous:
            raise AssertionError(f"{case.layer}/{case.case}: {name} must be C-contiguous to be perturbed in place")
        flat = x.reshape(-1)  # a view: perturbing it perturbs the tensor the module reads
        if x.size <= full_size:
            entries, wanted = range(x.size), x.size
        else:  # a random order of all entries: a kink's replacement is the next one
            entries, wanted = rng.permutation(x.size)[: 4 * sample], sample
        gflat = grad.reshape(-1)
        skipped = measured = 0
        for i in entries:
            if measured == wanted:
                break
            old = flat[i]

            def perturb(s, i=i, old=old):
                flat[i] = old + s

            def restore(i=i, old=old):
                flat[i] = old

            n = central_difference(perturb, restore)
            if n is None:  # derivative undefined at a kink: this entry cannot be checked by differences
                skipped += 1
                continue
            probes.append((str(tuple(int(j) for j in np.unravel_index(i, x.shape))), float(gflat[i]), n))
            measured += 1
        if x.size > full_size:
            k = tries = 0
            while k < directions and tries < 4 * directions:
                tries += 1
                u = rng.choice([-1.0, 1.0], size=x.shape)
                old = x.copy()

                def perturb(s, u=u, old=old):
                    x[...] = old + s * u

                def restore(old=old):
                    x[...] = old

                n = central_difference(perturb, restore)
                if n is None:  # straddles a kink: draw another direction
                    skipped += 1
                    continue
                probes.append((f"direction {k}", float(np.sum(grad * u)), n))
                k += 1
        errors = [rel_error(a, n, tiny) for _, a, n in probes]
        worst = max(errors) if errors else 0.0
        kept = [(p, a, n, e) for (p, a, n), e in zip(probes, errors)][:keep_samples]
        results.append(TensorResult(case.layer, case.case, name, tuple(x.shape), len(probes), worst, tolerance, kept,
                                    skipped))
    module.zero_grad()
    return results


# -- check(layer, *inputs): the same check for any object with the layer contract ------------------

@dataclass
class CheckReport:
    """What :func:`check` found: one :class:`TensorResult` per tensor, or the one line that stopped it.

    ``passed`` is true when the layer ran and every tensor is within the tolerance. ``print(report)``
    shows a table: tensor, shape, probes measured, probes dropped at ReLU kinks, worst relative error.
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


def format_results(results, indent: str = "") -> str:
    """A table of TensorResults: tensor, shape, probes, kinks, worst relative error, pass/FAIL."""
    w = max([len("tensor")] + [len(r.tensor) for r in results])
    ws = max([len("shape")] + [len(str(r.shape)) for r in results])
    rows = [f"{indent}{'tensor':<{w}}  {'shape':<{ws}}  {'probes':>6}  {'kinks':>5}  {'worst rel err':>13}  result"]
    rows += [f"{indent}{r.tensor:<{w}}  {str(r.shape):<{ws}}  {r.probes:>6}  {r.kinks:>5}  {r.max_rel_error:>13.2e}  "
             f"{'pass' if r.passed else 'FAIL'}" for r in results]
    return "\n".join(rows)


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
    from .backend import RandomState  # noqa: PLC0415

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
        return self.layer.modules() if hasattr(self.layer, "modules") else iter(())


def detached_copy(obj):
    """A deep copy of ``obj`` (a layer, the arguments of a call) that shares modules instead of copying
    them (a RandomState holds its array module, ``numpy``, which cannot be copied)."""
    import copy  # noqa: PLC0415
    import sys  # noqa: PLC0415

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
    import inspect  # noqa: PLC0415

    try:
        params = inspect.signature(backward).parameters.values()
    except (TypeError, ValueError):
        return False
    return not [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _input_names(forward, n: int) -> list:
    """The names of forward's first ``n`` positional parameters (``x``, ``memory``), ``argI`` where unknown."""
    import inspect  # noqa: PLC0415

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
    forward draws the same mask, and a probe that straddles a ReLU kink is dropped and replaced.
    The layer is checked as a float64 copy: the caller's layer and its ``.grad`` are not touched.

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
        from .user_code import exception_line  # noqa: PLC0415

        report.error = ("not implemented yet: " if isinstance(exc, NotImplementedError) else "the layer raised ") + \
            exception_line(exc)
        return report
    if not tensors:
        report.error = "nothing to check: the layer has no parameters and no float input"
        return report
    report.results = run_case(case, np.random.default_rng(seed), h=step, tolerance=tolerance)
    return report
