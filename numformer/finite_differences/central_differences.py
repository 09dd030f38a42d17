"""The finite-difference core: :func:`run_case` checks one :class:`GradCase`, tensor by tensor.

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

The step, and a probe measured again before it fails. The error of a central
difference has two terms::

    D(h) = L'(x) + h^2/6 L'''(x) + O(h^4)     truncation
                 + O(eps_64 |L| / h)           round-off of the two evaluations (eps_64 ~ 1.1e-16)

A fixed step balances them for one kind of layer only. h = 1e-5 (near
eps_64^(1/3) ~ 6e-6) suits the layers on random weights: h = 1e-6 left ~3e-11 of
round-off in the full model's derivatives, h = 1e-5 ten times less, with
truncation below 1e-10 relative. On a smooth but strongly curved layer (GELU on
trained weights, ``sin(a x)`` with a large ``a``) the truncation term
``h^2 L''' / (6 L')`` alone exceeds the tolerance: one tensor of 161 failed at
1.57e-6 and passed at a smaller step, which was the check's error, not the
backward's. So a probe chooses its step by halving, with Richardson's
extrapolation: a probe whose D(h) passes is done (two forwards, as before); one
that fails is measured again at h/2 and judged by

    R = (4 D(h/2) - D(h)) / 3 = L'(x) - h^4/480 L^(5)(x) + ...     (the h^2 term cancels)

whose round-off is about 3 eps_64 |L| / h (D(h/2) carries twice D(h)'s, weighted
4/3, plus D(h)'s weighted 1/3): still ~1e-10 relative at h = 1e-5. R estimates
L' better than D(h) whatever the backward says, so a wrong backward (a planted
bug, every mutant) still fails, against a figure closer to the truth; a right
one fails only where R's own error exceeds the tolerance. The cost: two more
forwards for a failing probe only (``refined`` counts them per tensor), none for
a passing one. ``h`` stays an argument (1e-5 by default).

Floor of the denominator: ``tiny = floor_ratio * max|analytic gradient|`` over the
whole case (floor_ratio 1e-3). Some gradients are exactly zero by symmetry (the
key bias: softmax is invariant to a shift of a whole row of scores), and entries
1000x smaller than the case's largest are at round-off level; a plain relative
error of two round-off-sized numbers is ~1 and says nothing. With the floor,
such entries must agree to ``tolerance * tiny`` in absolute terms instead.

Kinks: ReLU is not differentiable at 0. When the +h and -h evaluations of a
probe see different pieces of a layer that declares kinks (``kinks = True``, the
layer contract of :class:`numformer.module.Module`: ReLU's active set [x > 0]),
the difference quotient straddles a kink
and measures nothing; such a probe is dropped (counted in ``kinks``, reported)
and, for a sampled tensor or a direction, another entry or direction is drawn in
its place (up to four times the number asked for). A tensor none of whose probes
could be measured fails: no evidence is not a pass.

The kink test itself (which pieces a forward saw) is :mod:`numformer.finite_differences.kinks`;
:func:`analytic_gradients` is the one forward and backward that :func:`run_case`, the check of any
layer (:mod:`numformer.finite_differences.any_layer`) and the exercises' grading all start from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .kinks import active_set_signature, kinked

TINY = 1e-8  # below this |a| + |n|, both gradients are zero to round-off: the error is measured against TINY


class GradientShapeError(AssertionError):
    """A backward returned a gradient of another shape than its tensor's (the check cannot compare them)."""


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
    kinks: int = 0  # probes dropped because +h and -h saw different pieces of a declared kink (ReLU's active set)
    refined: int = 0  # probes that failed at h, measured again at h/2 and judged by Richardson's extrapolation

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
    Forward mode (numformer.finite_differences.tangent_checks), when given: jvp(module, input_tangents) -> the
    outputs' tangents (an array or a tuple, as forward's), after a forward, the parameters' tangents set;
    backward_jvp(module, upstream, upstream_dots) -> (dict input-name -> gradient, dict input-name -> its tangent).
    """

    layer: str
    case: str
    module: object
    inputs: dict
    forward: Callable
    backward: Callable
    before_forward: Callable | None = None
    params: dict | None = None
    jvp: Callable | None = None
    backward_jvp: Callable | None = None


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
             keep_samples: int = 0, floor_ratio: float = 1e-3, extrapolate: bool = True) -> list[TensorResult]:
    """Check every parameter and input tensor of ``case``; returns one TensorResult per tensor.

    ``extrapolate``: a probe failing at ``h`` is measured again at ``h / 2`` and judged by Richardson's
    extrapolation (the module docstring); False: the fixed step alone, as before (for comparisons)."""
    module = case.module
    upstream, tensors = analytic_gradients(case, rng)
    # walked once: every probe runs two forwards, and a decoder layer is some forty modules deep
    modules = list(module.modules())
    releases = [m.release_saved for m in modules if hasattr(m, "release_saved")]  # a foreign layer may have none
    pieced = kinked(modules)  # the layers declaring kinks (kinks = True): their active sets sign each forward

    def objective(upstream):
        """(L, kink signature): the signature is the pieces every declared kink was on in this forward."""
        if case.before_forward is not None:
            case.before_forward()
        outs = _as_tuple(case.forward(module, case.inputs))
        signature = active_set_signature(module, pieced)
        for release in releases:  # module.clear_cache(), without walking the tree again
            release()
        return float(sum(np.sum(o * g) for o, g in zip(outs, upstream))), signature

    def central_difference(perturb, restore, step):
        """((L(x + step d) - L(x - step d)) / 2 step, the sides' signature), or None when the two sides
        straddle a kink."""
        perturb(+step)
        lp, sp = objective(upstream)
        perturb(-step)
        lm, sm = objective(upstream)
        restore()
        return None if sp != sm else ((lp - lm) / (2 * step), sp)

    def derivative(perturb, restore, analytic):
        """(the difference quotient, refined?): D(h); where it fails the tolerance against ``analytic``,
        Richardson's (4 D(h/2) - D(h)) / 3 instead (the module docstring). None: the probe straddles a
        kink."""
        first = central_difference(perturb, restore, h)
        if first is None:
            return None
        if not extrapolate or rel_error(analytic, first[0], tiny) <= tolerance:
            return first[0], False
        half = central_difference(perturb, restore, h / 2)
        if half is None or half[1] != first[1]:  # a kink between h/2 and h: no extrapolation; D(h) stands
            return first[0], False
        return (4.0 * half[0] - first[0]) / 3.0, True

    # The floor of the error's denominator: a fraction of the largest gradient entry of the case.
    gmax = max([float(np.abs(g).max()) for _, _, g in tensors if g.size] + [0.0])
    tiny = max(floor_ratio * gmax, TINY)
    results = []
    for name, x, grad in tensors:
        if grad.shape != x.shape:
            raise GradientShapeError(f"{case.layer}/{case.case}: gradient of {name} has shape {grad.shape}, expected "
                                     f"{x.shape}")
        probes = []
        if not x.flags.c_contiguous:
            raise AssertionError(f"{case.layer}/{case.case}: {name} must be C-contiguous to be perturbed in place")
        flat = x.reshape(-1)  # a view: perturbing it perturbs the tensor the module reads
        if x.size <= full_size:
            entries, wanted = range(x.size), x.size
        else:  # a random order of all entries: a kink's replacement is the next one
            entries, wanted = rng.permutation(x.size)[: 4 * sample], sample
        gflat = grad.reshape(-1)
        skipped = measured = refined = 0
        for i in entries:
            if measured == wanted:
                break
            old = flat[i]

            def perturb(s, i=i, old=old):
                flat[i] = old + s

            def restore(i=i, old=old):
                flat[i] = old

            found = derivative(perturb, restore, float(gflat[i]))
            if found is None:  # derivative undefined at a kink: this entry cannot be checked by differences
                skipped += 1
                continue
            probes.append((str(tuple(int(j) for j in np.unravel_index(i, x.shape))), float(gflat[i]), found[0]))
            refined += found[1]
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

                analytic = float(np.sum(grad * u))
                found = derivative(perturb, restore, analytic)
                if found is None:  # straddles a kink: draw another direction
                    skipped += 1
                    continue
                probes.append((f"direction {k}", analytic, found[0]))
                refined += found[1]
                k += 1
        errors = [rel_error(a, n, tiny) for _, a, n in probes]
        worst = max(errors) if errors else 0.0
        kept = [(p, a, n, e) for (p, a, n), e in zip(probes, errors)][:keep_samples]
        results.append(TensorResult(case.layer, case.case, name, tuple(x.shape), len(probes), worst, tolerance, kept,
                                    skipped, refined))
    module.zero_grad()
    return results


def format_results(results, indent: str = "") -> str:
    """A table of TensorResults: tensor, shape, probes, kinks, worst relative error, pass/FAIL."""
    w = max([len("tensor")] + [len(r.tensor) for r in results])
    ws = max([len("shape")] + [len(str(r.shape)) for r in results])
    rows = [f"{indent}{'tensor':<{w}}  {'shape':<{ws}}  {'probes':>6}  {'kinks':>5}  {'worst rel err':>13}  result"]
    rows += [f"{indent}{r.tensor:<{w}}  {str(r.shape):<{ws}}  {r.probes:>6}  {r.kinks:>5}  {r.max_rel_error:>13.2e}  "
             f"{'pass' if r.passed else 'FAIL'}" for r in results]
    return "\n".join(rows)
