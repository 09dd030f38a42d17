"""The forward-mode checks: every layer's JVP against central differences of its forward, and the tangent of its
backward (Pearlmutter's R-operator, what exact Hessian-vector products are made of) against central differences
of its backward, in float64: :func:`run_tangent_case`, on a :class:`GradCase` that says how to run both modes.

A JVP is a directional derivative, so its check is direct: with random tangents ``t`` for the inputs and the
parameters (``numformer.forward_mode.tangents``),

    jvp(t)  ~  (f(x + h t) - f(x - h t)) / 2h           every entry of the output's tangent

and the backward's tangent, with random upstream gradients ``G`` and their tangent ``G_dot``,

    backward_jvp(G, G_dot)  ~  (grads(x + h t; G + h G_dot) - grads(x - h t; G - h G_dot)) / 2h

every entry of every parameter's ``grad_tangent`` and every input's gradient tangent: differences of gradients.
(``G_dot`` rides on the probe of all tensors at once; a probe of one tensor alone has ``G_dot = 0``, so its row
measures that tensor's second-order terms alone.)
Both quotients are extrapolated the Romberg way from the central differences D at h, h/2 and h/4:
``R1 = (4 D(h/2) - D(h)) / 3`` cancels the ``h^2`` term of the truncation (central_differences.py), the same
one level down cancels ``h^4``: ``(16 R1(h/2) - R1(h)) / 15``, whose truncation is ``O(h^6)`` and rounding about
``10 eps |f| / h``. With ``h = 1e-3`` (:data:`STEP`, in units of the random tangents) both are near 1e-12 of
the derivative on these layers, where Richardson's one level at 1e-5 left up to 7e-8 (rounding) and at 1e-3
up to 8e-7 (truncation): the 1e-7 these checks ask of a JVP needs the second level.

Probes: the tangents of all tensors at once (``along all``), and of each tensor alone (``along NAME``), so that a
term missing from one tensor's contribution cannot hide behind another's; a case of more than
:data:`ONE_BY_ONE` tensors takes that many of them alone, drawn at random. Rows: a JVP row per probe (the worst
entry of the outputs' tangents), an R-op row per tensor whose gradient tangent is compared (the worst over the
probes). The error of an entry is ``|a - n| / max(|a| + |n|, tiny)``, ``tiny`` a fraction ``floor_ratio`` of the
largest analytic entry of the probe of all tensors (entries a thousand times smaller are at rounding level; gradients that are zero
by symmetry, the key bias's, must agree to ``tolerance * tiny`` in absolute terms).

Kinks: the tangents are taken on the pieces the forward saw (ReLU's ``x_dot * [x > 0]``); a probe whose
forwards do not all see the point's pieces (its signature, numformer.finite_differences.kinks) is measured again
at a step ten times smaller, up to three times. When it still crosses a kink (an input sitting on one, as ReLU's
0), the entries whose move crosses it are found by halving the tangent's support and left out of that probe (the
``kinks`` column counts them); a probe with no entry left fails: no evidence is not a pass.
"""
from __future__ import annotations

import numpy as np

from ..forward_mode import tangents
from .central_differences import GradCase, TensorResult, rel_error
from .kinks import active_set_signature, kinked

ONE_BY_ONE = 8      # tensors given a probe of their own (all of them in a smaller case)
ROMBERG = 2         # extrapolation levels: central differences at h, h/2, h/4 (error O(h^6))
TOLERANCE = 1e-7    # the largest relative error that passes
ROUNDING = 10.0     # Romberg's rounding, in eps |f| / h (module docstring)
STEP = 1e-3         # the first step: Romberg's truncation (h^6) is then far below its rounding (~10 eps |f| / h)
SHRINK = 10.0       # a probe straddling a kink is measured again at step / SHRINK ...
SHRINKS = 3         # ... up to this many times


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays]) if arrays else np.zeros(0)


def _worst(analytic: np.ndarray, numeric: np.ndarray, tiny: float) -> float:
    if analytic.size == 0:
        return 0.0
    return max(rel_error(float(a), float(n), tiny) for a, n in zip(analytic, numeric))


def _rounding(arrays, h: float) -> float:
    """The differences' rounding error, ``ROUNDING * eps |f| / h`` for the largest entry |f| of ``arrays``."""
    biggest = max([float(np.abs(np.asarray(a, dtype=np.float64)).max()) for a in _nested(arrays) if np.size(a)]
                  + [0.0])
    return ROUNDING * np.finfo(np.float64).eps * biggest / h


def _nested(arrays):
    for a in arrays:
        if isinstance(a, (list, tuple)):
            yield from _nested(a)
        else:
            yield a


def _floor(arrays, floor_ratio: float) -> float:
    biggest = max([float(np.abs(np.asarray(a)).max()) for a in arrays if np.size(a)] + [0.0])
    return max(floor_ratio * biggest, 1e-300)


def run_tangent_case(case: GradCase, rng: np.random.Generator, h: float = STEP, tolerance: float = TOLERANCE,
                     floor_ratio: float = 1e-3, explicit_zeros: bool = False) -> list[TensorResult]:
    """Check ``case.jvp`` and ``case.backward_jvp`` (both must be set) against central differences of
    ``case.forward`` and ``case.backward``; returns the JVP rows, then the R-op rows (module docstring).

    ``explicit_zeros``: the parameters outside a probe get a tangent of zeros rather than the symbolic zero
    (``Parameter.nonzero_tangent`` None), so a student's function is always handed arrays."""
    if case.jvp is None or case.backward_jvp is None:
        raise ValueError(f"{case.layer}/{case.case}: no jvp and backward_jvp to check")
    module = case.module
    module.train()
    params = case.params if case.params is not None else dict(module.named_parameters())
    inputs = case.inputs
    modules = list(module.modules())
    pieced = kinked(modules)
    releases = [m.release_saved for m in modules if hasattr(m, "release_saved")]

    def run_forward():
        if case.before_forward is not None:
            case.before_forward()
        return _as_tuple(case.forward(module, inputs))

    outs = run_forward()
    point = active_set_signature(module, pieced)
    upstream = [rng.standard_normal(np.shape(o)) for o in outs]
    upstream_dot = [rng.standard_normal(np.shape(o)) for o in outs]
    names = list(params) + [f"input:{n}" for n in inputs]
    arrays = {**{n: p.data for n, p in params.items()}, **{f"input:{n}": a for n, a in inputs.items()}}
    directions = {n: rng.standard_normal(np.shape(a)) for n, a in arrays.items()}
    alone = names if len(names) <= ONE_BY_ONE else [names[i] for i in sorted(rng.permutation(len(names))[:ONE_BY_ONE])]
    probes = [("all", names)] + [(n, [n]) for n in alone]
    for release in releases:
        release()

    def upstream_dot_of(along):
        return upstream_dot if along is names else [np.zeros_like(g) for g in upstream_dot]

    def analytic(along, dirs):
        """(the outputs' tangents, {tensor: its gradient's tangent}) along the tangents ``dirs`` of ``along``."""
        given = _given(params, along, dirs, explicit_zeros)
        with tangents(module, given):
            run_forward()
            out_dots = _as_tuple(case.jvp(module, {n: dirs[f"input:{n}"] if f"input:{n}" in along
                                                   else np.zeros_like(a) for n, a in inputs.items()}))
            module.zero_grad()
            _, input_grad_dots = case.backward_jvp(module, upstream, upstream_dot_of(along))
            grad_dots = {n: np.array(p.grad_tangent) for n, p in params.items()}
        module.zero_grad()
        grad_dots.update({f"input:{n}": np.asarray(g) for n, g in input_grad_dots.items()})
        return out_dots, grad_dots

    def shifted(along, dirs, s, backward=True):
        """(the outputs, {tensor: its gradient}, the kinks' signature) at the point + s * tangent, upstream
        G + s G_dot (no gradients when not ``backward``); the point is restored after."""
        saved = {n: arrays[n].copy() for n in along}
        try:
            for n in along:
                arrays[n][...] = saved[n] + s * dirs[n]
            outs = run_forward()
            signature = active_set_signature(module, pieced)
            if not backward:
                return None, None, signature
            module.zero_grad()
            input_grads = case.backward(module, [g + s * gd for g, gd in zip(upstream, upstream_dot_of(along))])
            grads = {n: np.array(p.grad) for n, p in params.items()}
            grads.update({f"input:{n}": np.asarray(g) for n, g in input_grads.items()})
            return [np.array(o, dtype=np.float64) for o in outs], grads, signature
        finally:
            for n in along:
                arrays[n][...] = saved[n]
            for release in releases:
                release()
            module.zero_grad()

    def differences(along, dirs):
        """Romberg's extrapolation of the central differences at h, h/2, h/4 (module docstring) of the outputs
        and of the gradients, or None at a kink."""
        step = h
        for _ in range(SHRINKS + 1):
            steps = [step / 2 ** k for k in range(ROMBERG + 1)]
            sides = [(shifted(along, dirs, s), shifted(along, dirs, -s)) for s in steps]
            if all(side[2] == point for pair in sides for side in pair):
                def romberg(get):
                    d = [(get(plus) - get(minus)) / (2 * s) for (plus, minus), s in zip(sides, steps)]
                    for level in range(1, ROMBERG + 1):  # each level cancels the next even power of h
                        d = [(4 ** level * fine - coarse) / (4 ** level - 1) for coarse, fine in zip(d, d[1:])]
                    return d[0]
                outs = [romberg(lambda side, i=i: side[0][i]) for i in range(len(outs_shape))]
                grads = {n: romberg(lambda side, n=n: side[1][n]) for n in sides[0][0][1]}
                return outs, grads
            step /= SHRINK
        return None

    def away_from_kinks(along, dirs):
        """``dirs`` with the entries whose move crosses a kink even at the smallest step set to zero (found by
        halving: a group whose two sides see the point's pieces keeps its entries), and how many were zeroed."""
        sizes = [int(np.size(dirs[n])) for n in along]
        starts = np.cumsum([0] + sizes)

        def restricted(index):
            keep = np.zeros(starts[-1], dtype=bool)
            keep[index] = True
            return {**dirs, **{n: dirs[n] * keep[a:b].reshape(np.shape(dirs[n]))
                               for n, a, b in zip(along, starts, starts[1:])}}

        smallest = h / SHRINK ** SHRINKS

        def quiet(index):
            d = restricted(index)
            return all(shifted(along, d, s, backward=False)[2] == point for s in (smallest, -smallest))

        def kept(index):
            if quiet(index):
                return [index]
            if len(index) == 1:
                return []
            half = len(index) // 2
            return kept(index[:half]) + kept(index[half:])
        groups = kept(rng.permutation(starts[-1]))
        index = np.concatenate(groups) if groups else np.zeros(0, dtype=int)
        if groups and not quiet(index):  # together they cross one: the largest group alone
            index = max(groups, key=len)
        return restricted(index), int(starts[-1] - len(index))

    outs_shape = [np.shape(o) for o in outs]
    jvp_rows, rop_worst, rop_probes, rop_kinks = [], {}, {}, {}
    found = [(label, along, directions, analytic(along, directions)) for label, along in probes]
    # the floors: a fraction of the largest analytic entry of the probe of all tensors at once (a probe of one
    # tensor alone may have an output or a gradient tangent that is zero by symmetry, the key bias's), and never
    # below what the differences' own rounding can reach, ROUNDING * eps |f| / h, over the tolerance (the JVP of a
    # scalar loss along the key bias is zero, and its quotient that rounding, a millionth of the loss or less)
    base = shifted(names, directions, 0.0)
    out_floor = max(_floor(found[0][3][0], floor_ratio), _rounding([base[0]], h) / tolerance)
    grad_floor = max(_floor(found[0][3][1].values(), floor_ratio), _rounding(base[1].values(), h) / tolerance)
    for label, along, dirs, (out_dots, grad_dots) in found:
        numeric, dropped = differences(along, dirs), 0
        if numeric is None:  # a kink within the smallest step: the entries that cross it are left out
            dirs, dropped = away_from_kinks(along, dirs)
            if dropped < sum(int(np.size(dirs[n])) for n in along):
                out_dots, grad_dots = analytic(along, dirs)
                numeric = differences(along, dirs)
        if numeric is None:
            jvp_rows.append(TensorResult(case.layer, case.case, f"jvp along {label}", (), 0, 0.0, tolerance,
                                         kinks=max(dropped, 1)))
            for n in grad_dots:
                rop_kinks[n] = rop_kinks.get(n, 0) + max(dropped, 1)
            continue
        num_outs, num_grads = numeric
        a, n_ = _flat(out_dots), _flat(num_outs)
        jvp_rows.append(TensorResult(case.layer, case.case, f"jvp along {label}", tuple(a.shape), 1,
                                     _worst(a, n_, out_floor), tolerance, kinks=dropped))
        for name, g in grad_dots.items():
            if name not in num_grads:
                raise AssertionError(f"{case.layer}/{case.case}: backward_jvp gave a tangent for {name}, backward "
                                     "no gradient")
            if g.shape != num_grads[name].shape:
                raise AssertionError(f"{case.layer}/{case.case}: the gradient tangent of {name} has shape "
                                     f"{g.shape}, the gradient {num_grads[name].shape}")
            e = _worst(g.reshape(-1), num_grads[name].reshape(-1), grad_floor)
            rop_worst[name] = max(rop_worst.get(name, 0.0), e)
            rop_probes[name] = rop_probes.get(name, 0) + 1
            rop_kinks[name] = rop_kinks.get(name, 0) + dropped
    rop_rows = [TensorResult(case.layer, case.case, f"R-op of {name}", tuple(np.shape(arrays[name])),
                             rop_probes.get(name, 0), rop_worst.get(name, 0.0), tolerance, kinks=rop_kinks.get(name, 0))
                for name in names if name in rop_worst or name in rop_kinks]
    for release in releases:
        release()
    return jvp_rows + rop_rows


def _given(params, along, dirs, explicit_zeros: bool) -> dict:
    """The parameters' tangents of a probe along ``along``: theirs from ``dirs``, every other parameter's zeros
    (``explicit_zeros``) or the symbolic zero (left out)."""
    given = {n: dirs[n] for n in along if not n.startswith("input:")}
    if explicit_zeros:
        given.update({n: np.zeros(np.shape(p.data)) for n, p in params.items() if n not in given})
    return given


def analytic_tangents(case: GradCase, rng: np.random.Generator, kind: str, explicit_zeros: bool = True) -> list:
    """One run of ``case``'s forward mode with random tangents, upstream gradients and their tangents drawn from
    ``rng``: what a forward-mode candidate is graded on, under the names of :func:`run_tangent_case`'s rows.

    ``kind "rop"``: with every tensor's tangent and the upstream's, each gradient's tangent: ``("R-op of NAME",
    value, value)``. ``kind "jvp"``: for every parameter and float input alone, then all at once, the outputs'
    tangents (the outputs flattened end to end): ``("jvp along NAME", value, value)``, then the R-op's rows as well,
    since a layer's jvp also keeps what the tangent of its backward reads (LayerNorm's r_dot moves no output, only
    the backward's tangent). (The middle item stands where
    :func:`~numformer.finite_differences.central_differences.analytic_gradients` puts the tensor itself: the shape a
    result must have.) ``explicit_zeros`` (the default here: a candidate is a student's function): the parameters
    outside a probe get zeros as their tangent, never the symbolic zero."""
    if kind not in ("jvp", "rop"):
        raise ValueError(f"kind must be jvp or rop, got {kind!r}")
    module = case.module
    module.train()
    params = case.params if case.params is not None else dict(module.named_parameters())
    inputs = case.inputs

    def forward():
        if case.before_forward is not None:
            case.before_forward()
        return _as_tuple(case.forward(module, inputs))

    outs = forward()
    upstream = [rng.standard_normal(np.shape(o)) for o in outs]
    upstream_dot = [rng.standard_normal(np.shape(o)) for o in outs]
    names = list(params) + [f"input:{n}" for n in inputs]
    arrays = {**{n: p.data for n, p in params.items()}, **{f"input:{n}": a for n, a in inputs.items()}}
    directions = {n: rng.standard_normal(np.shape(a)) for n, a in arrays.items()}

    def run(along, backward: bool):
        with tangents(module, _given(params, along, directions, explicit_zeros)):
            forward()
            out_dots = _as_tuple(case.jvp(module, {n: directions[f"input:{n}"] if f"input:{n}" in along
                                                   else np.zeros_like(a) for n, a in inputs.items()}))
            if not backward:
                module.clear_cache()
                return _flat(out_dots)
            module.zero_grad()
            _, input_dots = case.backward_jvp(module, upstream, upstream_dot)
            found = {n: np.array(p.grad_tangent) for n, p in params.items()}
        module.zero_grad()
        found.update({f"input:{n}": np.asarray(g) for n, g in input_dots.items()})
        return found

    rop = [(f"R-op of {n}", g, g) for n, g in run(names, True).items()]
    if kind == "rop":
        return rop
    return [(f"jvp along {label}", v, v) for label, v in
            [(n, run([n], False)) for n in names] + [("all", run(names, False))]] + rop
