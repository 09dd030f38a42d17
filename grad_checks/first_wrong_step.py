"""The first step a student's backward gets wrong, named only where the value it must hold is known.

The student's backward and numformer's run on the same cases with every array recorded (grad_checks/recorded_run.py),
and the student's code is replayed with one value changed (``Recorder.overrides``). A value is *known* at one of the
student's expressions when, put there, every gradient of every case comes out right, and it comes from outside the
student's code: numformer's backward or forward (helpers' included), an argument, a size the exercise names, the
adjoint of a forward quantity (grad_checks/adjoints.py), or for a quantity of the forward side a multiple of one
(a backward is linear in its gradient); the only known one that does. The first wrong step is such an expression
with right inputs (known, arguments, the student's forward-side definitions), the smallest of its statement; inputs
on other lines that could absorb the error (least squares on the replays), positions one small change of which
would, values of a shape nothing has, are named with it, never one alone; a fix that turns a right value wrong is a
compensation. Two mistakes: two such values that together put everything right. Float32 lines are named first.
Otherwise the wrong returned values are said with the lines feeding them. The edit search (grad_checks/own_route.py)
only suggests a fix at the line named. docs/exercises.md, section 6, says it with examples; replays stop after
:data:`SEARCH_BUDGET` seconds, and the diagnosis then says so.
"""
from __future__ import annotations

import inspect
import re
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from numformer.swap import using
from numformer.user_code_clock import StudentCodeTimeout

from .adjoints import CLOSE, adjoints
from .candidates import APPROX, floor, relative_errors, run_class
from .counterparts import factor, reduced, same, swapped_shape, views
from .entry_patterns import entry_pattern
from .factor_names import expressions, name_factor, symbol_values
from .own_route import suggestion
from .recorded_run import Recorder, recorded
from .sublayers_passed import sublayers_passed

MOST = 3        # first wrong steps said at most
OURS = "numformer's "  # how a sentence starts naming numformer's value (not said twice: "numformer's passes `x`")

# Seconds of replays (the student's code run again with a value changed) one wrong answer's diagnosis may take before
# it stops and says what it has: the wrong entries and the lines feeding them, never a guess. On the project's sets
# (2-core Zen 3, other jobs running) the median diagnosis takes well under a second; 3 s leaves the slowest a margin
# on a loaded machine, and a student waits a few seconds for a slow backward's proof, not the clock's 10 s a case.
SEARCH_BUDGET = 3.0


@dataclass
class WrongStep:
    """A first wrong step: the known value (``name``, its ``code`` and ``variable``: numformer's intermediate, or what
    the value is), the student's line, the factor or entry pattern, the sentence."""

    name: str
    code: str
    variable: str | None
    line: int | None
    factor: str | None
    pattern: str | None
    said: str
    note: str = ""      # the operand the student used in place of numformer's, when that is the difference
    proven: bool = True     # False: no step proven; the wrong returned value and the student's lines feeding it
    lines: tuple = ()       # those lines (an unproven sentence, or the lines named together), in the student's file
    own: bool = False       # the known value is not numformer's backward's (an adjoint, a size, the forward's)


# -- running both, recorded -------------------------------------------------------------------------------

# answer -> {exercise name: (Recorder, the layer class running the answer recorded into it (None: its code cannot be
# rewritten), the same unguarded)}: the code is rewritten and compiled once (30 ms, most of a replay's time), and
# each replay only empties the recorder
_RECORDED = weakref.WeakKeyDictionary()


def _recorded_class(ex, answer, overrides=None, guard: bool = True) -> tuple:
    """(a Recorder with ``overrides`` and no calls yet, the layer class running ``answer`` recorded into it, or None
    when its code cannot be rewritten). ``guard`` False: a function's outputs unchecked (grad_checks/exercise.py's
    guard runs numformer's backward beside it, 70% of a replay, and the first run has checked them already)."""
    per_exercise = _RECORDED.setdefault(answer, {})
    if ex.name not in per_exercise:
        recorder = Recorder()
        if isinstance(answer, type):  # a whole class: its own method, recorded, in a subclass of it
            fn = recorded(vars(answer).get(ex.target.__name__), recorder)
            cls = type(answer.__name__, (answer,), {ex.target.__name__: fn}) if fn else None
            classes = (cls, cls)
        else:
            fn = recorded(answer, recorder, helpers=answer is ex.target)
            classes = (ex.layer_class(fn, guard=answer is not ex.target), ex.layer_class(fn, guard=False)) if fn \
                else (None, None)
        per_exercise[ex.name] = (recorder, *classes)
    recorder, guarded, unguarded = per_exercise[ex.name]
    recorder.calls, recorder.overrides = [], overrides or {}
    return recorder, guarded if guard else unguarded


class Recordings:
    """The student's run and numformer's, each recorded once (:func:`recorded_run`) for every part of a diagnosis
    that reads them: :func:`first_wrong_steps` and grad_checks/raised_line.py."""

    def __init__(self, ex, answer, seed: int = 0, file=None, time_limit=None, guard: bool = True):
        self.ex, self.answer, self.seed, self.file, self.time_limit = ex, answer, seed, file, time_limit
        self.guard = guard  # False: a call returning a wrong shape does not stop its case (first_wrong_steps)

    @cached_property
    def student(self) -> tuple:
        return recorded_run(self.ex, self.answer, self.seed, self.file, self.time_limit, guard=self.guard)

    @cached_property
    def reference(self) -> tuple:
        return recorded_run(self.ex, self.ex.target, self.seed)

    @cached_property
    def forward(self) -> list:
        """The :class:`~grad_checks.recorded_run.Call` of numformer's forward function on every case (x - mu, var,
        var + eps: the values a route through the forward's intermediates takes), or [] (see :func:`forward_twin`)."""
        twin = forward_twin(self.ex)
        recorder = Recorder()
        fn = recorded(twin, recorder) if twin is not None else None
        if fn is None:
            return []
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            run_class(self.ex, using(self.ex.layer, **{self.ex.target.__name__: self.ex.target, twin.__name__: fn}),
                      self.seed, each=lambda i: setattr(recorder, "case", i))
        return recorder.calls


def forward_twin(ex):
    """numformer's forward function beside the exercise's backward (``layernorm_forward`` for
    ``layernorm_backward``) that its layer calls, or None (a method's exercise: the layer's forward is code of its
    children)."""
    name = ex.target.__name__.replace("backward", "forward")
    fn = getattr(sys.modules[ex.target.__module__], name, None)
    forward = inspect.unwrap(ex.layer.forward)
    if ex.is_method or name == ex.target.__name__ or not callable(fn) or name not in forward.__code__.co_names:
        return None
    return fn


def recorded_run(ex, answer, seed: int = 0, file=None, time_limit=None, overrides=None, guard: bool = True) -> tuple:
    """(calls, outcomes): the :class:`~grad_checks.recorded_run.Call` of every run of ``answer`` on the exercise's
    cases (with ``overrides``, see Recorder) and the gradients every case graded (parameters' included), or (None,
    None) when its code cannot be recorded. ``guard`` False: a replay's (see :func:`_recorded_class`)."""
    recorder, cls = _recorded_class(ex, answer, overrides, guard)
    if cls is None:
        return None, None
    _, outcomes = run_class(ex, cls, seed, file, time_limit, each=lambda i: setattr(recorder, "case", i))
    if answer is ex.target and any(o.error is not None for o in outcomes):
        return None, None  # numformer's own code failed when recorded: say nothing rather than something wrong
    return recorder.calls, outcomes


# -- the replays -------------------------------------------------------------------------------------------------

class _Stopped(Exception):
    """The diagnosis' budget is spent: no replay starts."""


@dataclass
class _Proof:
    """The student's code replayed with values changed, within the budget; every gradient judged as the grading
    judges it."""

    ex: object
    answer: object
    seed: int
    file: object
    time_limit: object
    mine: list          # the student's outcomes (every graded gradient, per case)
    reference: list     # numformer's
    budget: float       # seconds of replays (SEARCH_BUDGET)
    starts: dict = field(default_factory=dict)  # case -> the number of its first call in a run of every case

    def __post_init__(self):
        self.until = time.monotonic() + self.budget

    def _replay(self, run, stopped=None):
        """``run(limit)`` quietly (a replayed value may overflow: no proof, no noise), within the budget: _Stopped
        past it. The student's code runs under the clock's limit cut to what is left of the budget; stopped by the
        clock with budget left (an edit that loops), ``stopped`` comes back, or _Stopped when that is None."""
        left = self.until - time.monotonic()
        if left <= 0:
            raise _Stopped
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                return run(min(self.time_limit or left, left))
            except StudentCodeTimeout:
                if stopped is None or time.monotonic() >= self.until:
                    raise _Stopped from None
                return stopped

    def students(self, overrides, case=None, calls=False) -> list:
        """The student's outcomes with ``overrides`` ({(call, key): value}, calls numbered as in a run of every
        case); ``case``: that case alone (the others None); ``calls``: (the recorded calls, the outcomes)."""
        start = self.starts.get(case, 0) if case is not None else 0
        recorder, cls = _recorded_class(self.ex, self.answer, {(n - start, key): v for (n, key), v in overrides.items()},
                                        guard=False)
        got = self._replay(lambda limit: run_class(self.ex, cls, self.seed, self.file, limit,
                                                   order=None if case is None else [case])[1],
                           stopped=[None] * len(self.reference))
        return (recorder.calls, got) if calls else got

    def run(self, fn, cases):
        """The outcomes of the student's code edited (``fn``) on ``cases`` (from 0; None: every case), None in the
        place of a case not run."""
        cls = self.ex.layer_class(fn, guard=False)  # a wrong shape is an error as good as the guard's here
        return self._replay(lambda limit: run_class(self.ex, cls, self.seed, self.file, limit, order=cases)[1],
                            stopped=[None] * len(self.reference))

    def agreeing(self, outcomes, against=None) -> list:
        """Per case, {tensor: where ``outcomes`` agree with numformer's (``against``: those outcomes instead), to the
        grading's tolerance}, None for a case not run; a tensor missing or of another shape agrees nowhere."""
        out = []
        for k, ref in enumerate(against or self.reference):
            new = outcomes[k] if outcomes else None
            if new is None or new.grads is None or ref.grads is None:
                out.append(None)
                continue
            tiny = floor(self.reference[k].grads)
            out.append({name: _agree(new.grads[name], g, tiny) if name in new.grads and np.shape(new.grads[name])
                        == np.shape(g) else np.zeros(np.shape(g), bool) for name, g in ref.grads.items()})
        return out

    def right(self, outcomes, cases=None) -> bool:
        """Every gradient of ``outcomes`` right on ``cases`` (None: every case the student's code ran, a wrong shape
        returned included: one that raised is the error line's to tell, grad_checks/raised_line.py)."""
        ran = [k for k, m in enumerate(self.mine) if m.ran] if cases is None else cases
        return outcomes is not None and all(v is not None and all(a.all() for a in v.values())
                                            for k, v in enumerate(self.agreeing(outcomes)) if k in ran)


def _agree(a, b, tiny):
    return relative_errors(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), tiny) <= APPROX


def _flat(outcomes, names, cases=None) -> np.ndarray | None:
    """The graded gradients of ``outcomes`` on ``cases`` (None: every case), in ``names``' order, as one vector (None:
    one missing)."""
    parts = []
    for k, (out, case_names) in enumerate(zip(outcomes or [], names)):
        if cases is not None and k not in cases:
            continue
        if out is None or out.grads is None or any(n not in out.grads for n in case_names):
            return None
        parts += [np.asarray(out.grads[n], dtype=np.float64).ravel() for n in case_names]
    return np.concatenate(parts) if parts else None


# -- known values --------------------------------------------------------------------------------------------------

@dataclass
class Known:
    """A value known independently of the student's code, in every call where it exists: numformer's backward's
    (or forward's) record, an argument, a size the exercise names, an adjoint (grad_checks/adjoints.py)."""

    kind: str           # "backward", "forward", "argument", "size", "adjoint"
    values: dict        # call number -> array
    label: str          # what a sentence calls it: "dS", "dxhat", "1/keep", "dL/d(var)"
    code: str           # numformer's code of it ("" for a size; what it is, for an adjoint)
    variable: str | None = None
    records: dict = field(default_factory=dict)  # call number -> numformer's Record (backward, forward, argument)


def _label(ex, record) -> str:
    if record.inside is not None:
        return f"numformer's `{record.code}` in {record.inside}"
    if record.code in ex.names:
        return ex.names[record.code]
    if record.variable and record.variable in ex.names:
        return ex.names[record.variable]
    if record.returned is not None and record.returned < len(ex.outputs):
        return f"the returned {ex.outputs[record.returned]}"
    return record.variable or record.code


def _knowns(ex, ref_calls, forward) -> list:
    """Every array of numformer's backward and forward, by its key, in the calls holding it; equal values once (the
    first: ``dx = ...`` before ``return dx``); numbers left out (a number is known as a size, :func:`_sizes`)."""
    out, seen = [], {}
    for source, calls in (("backward", ref_calls), ("forward", forward)):
        by_key = {}
        for n, call in enumerate(calls):  # a helper's arrays after the caller's: a value both hold is the caller's
            for r in sorted(call.records, key=lambda r: r.inside is not None):
                by_key.setdefault(r.key, {})[n] = r
        for key, records in by_key.items():
            first = next(iter(records.values()))
            if first.value.ndim == 0:
                continue
            label = _label(ex, first) if source == "backward" or first.given else \
                ex.names.get(first.code) or f"numformer's forward's `{first.code}`"
            known = Known("argument" if first.given else source, {n: r.value for n, r in records.items()},
                          label, first.code, first.variable, records)
            sig = tuple(sorted((n, r.value.shape) for n, r in records.items()))  # (a call's shapes may differ)
            if any(all(same(known.values[n], k.values[n]) for n in records) for k in seen.get(sig, [])):
                continue
            seen.setdefault(sig, []).append(known)
            out.append(known)
    return out


def _sizes(engine, key) -> list:
    """For a number of the student's computed from the arguments (a 0-d record): the sizes the exercise names and
    expressions of one or two of them (grad_checks/factor_names.py), as Knowns, per call."""
    per_call = engine.records[key]
    first = next(iter(per_call.values()))
    if first.value.ndim != 0 or not first.operands:
        return []
    values = {n: symbol_values(engine.ex, engine.my_calls[n].args) for n in per_call}
    common = [s for s in next(iter(values.values())) if all(s in v for v in values.values())]
    out = []
    for name, fn in expressions(common):
        try:
            out.append(Known("size", {n: np.array(fn(v)) for n, v in values.items()}, name, ""))
        except (ZeroDivisionError, ValueError):
            continue
    return out


def _aligned(forward, ref_calls) -> list:
    """numformer's forward calls in the order of its backward calls (the backward's given arrays are values its
    forward computed: xhat and r), or [] when there are none."""
    if not forward:
        return []
    out = []
    for call in ref_calls:
        given = [r.value for r in call.records if r.given]
        out.append(max(forward, key=lambda f: sum(any(v.shape == r.value.shape and same(v, r.value)
                                                      for r in f.records) for v in given)))
    return out


def _close(a, b) -> bool:
    """Equal to the precision of central differences (grad_checks/adjoints.py's CLOSE)."""
    return float(np.abs(a - b).max()) <= CLOSE * max(float(np.abs(b).max()), float(np.abs(a).max()), 1e-300)


def _view(mine, theirs):
    return next(iter(views(mine, theirs.shape)), None) if mine.size == theirs.size else None


def _equal(a, b) -> bool:
    return a.size == b.size and any(same(v, b) for v in views(a, b.shape))


# -- the diagnosis -----------------------------------------------------------------------------------------------

@dataclass
class _Fix:
    """The student's expression ``key`` given the known value ``known`` (times ``c``, per case: None for 1)."""

    key: tuple
    known: Known
    c: dict | None = None       # case -> the factor the student's route needs on the known value
    reduced: str = ""           # how the student's is the known value reduced ("summed over its axis 0 as well")
    shape: str = ""             # the known value has another shape, which the student's code takes as well
    after: Known | None = None  # the student's value is this one of numformer's, the known value computed from it

    def values(self, engine) -> dict:
        return {(n, self.key): self.known.values[n] * (1.0 if self.c is None else self.c.get(
            engine.my_calls[n].case, 1.0)) for n in engine.records[self.key] if n in self.known.values}


class _Engine:
    """One wrong answer: the student's records and numformer's, what is right, and the replays."""

    def __init__(self, ex, proof, my_calls, ref_calls, forward, adjoints=None):
        self.ex, self.proof, self.my_calls, self.ref_calls = ex, proof, my_calls, ref_calls
        self.forward = _aligned(forward, ref_calls)
        self.knowns = _knowns(ex, ref_calls, self.forward)
        self.adjoints = adjoints
        self.names = [sorted(r.grads) if r.grads is not None else [] for r in proof.reference]
        self.target = _flat(proof.reference, self.names)
        params = [p for p in inspect.signature(ex.target).parameters if p != "self"]
        self.upstream = set(ex.upstream or params[:1])
        self.first_param = params[0] if params else None
        self.records = {}   # key -> {call number: the student's record}
        for n, call in enumerate(my_calls):
            for r in call.records:
                self.records.setdefault(r.key, {})[n] = r
        for n, call in enumerate(my_calls):
            proof.starts.setdefault(call.case, n)
        self.wrong_cases = [k for k in range(len(proof.mine)) if not proof.right(proof.mine, [k])]
        self.wrong_calls = [n for n, c in enumerate(my_calls) if c.returned and c.case in self.wrong_cases]
        self.partial = []   # fixes that put right every tensor they change, another still wrong (see fits)
        self._not_adjoint, self._absorbing = set(), {}  # keys no adjoint is; key -> whether it can absorb the error
        self._down = {}     # call -> {record index: the indices computed from it}

    # -- what the student's values are ------------------------------------------------------------------------
    @cached_property
    def right(self) -> set:
        """The keys of the student's records equal (up to a view) to a known value in every call holding them: a
        value of numformer's backward or forward, or an argument (the adjoints are asked in :meth:`slice`). A name
        passed on (``self.norm.backward(dy)``, ``return dx``) is never right by its value alone: it can stand where
        another value belongs; nor is a conditional's branch returned (``return ... if isinstance(got, tuple) else dx``). A quantity of the forward side is right by an argument, numformer's forward or a
        named value of its backward, or by a use of it that is right (``t = 2 * gate - 1``, whose ``0.5 * (1 + t)``
        is the gate): part of an expression of numformer's backward may equal it by chance (``2 * gate``, where the
        t of ``2 * gate - 1`` lost its term). A number equal to a constant numformer's backward reads is right."""
        out = {key for key, per_call in self.records.items()
               if all(r.kind != "name" and not (r.kind == "IfExp" and r.returned is not None)
                      and not self._returned_transposed(n, r) and (self._known_value(n, r, self.knowns if self.gradient_side(n, r) else
                                                               self._trusted(n, r)) or self._stacked(n, r))
                      for n, r in per_call.items())}
        target = inspect.unwrap(self.ex.target)
        constants = [v for name in target.__code__.co_names if type(v := target.__globals__.get(name)) is float]
        def constant(r):  # C = sqrt(2 / pi) where it is first computed (not du = c * 1, which equals it too)
            return r.value.ndim == 0 and any(np.isclose(float(r.value), c, rtol=1e-12, atol=0) for c in constants)
        out |= {key for key, per_call in self.records.items() if all(
            constant(r) and not any(constant(self.my_calls[n].records[i]) for i in r.operands)
            for n, r in per_call.items())}
        own = [key for key, per_call in self.records.items() if key not in out and all(
            not r.given and r.kind != "name" and not self.gradient_side(n, r) for n, r in per_call.items())]
        while True:
            used = [key for key in own if key not in out and all(
                any(self.my_calls[n].records[d].key in out for d in self._users(n, r.index)) for n, r in
                self.records[key].items())]
            if not used:
                return out
            out.update(used)

    def _returned_transposed(self, n, record) -> bool:
        """The student's value is returned (as it is or by its name) in numformer's transposed layout: right as a
        view inside the code (a ``k^T`` kept), wrong as what is returned (dW (d_out, d_in) for (d_in, d_out))."""
        call = self.my_calls[n]
        places = {r.returned for r in call.records if r.returned is not None and (
            r is record or r.kind == "name" and r.operands == (record.index,))}
        theirs = [r for r in self.ref_calls[n].records if r.returned in places]
        return any(t.value.shape != record.value.shape and t.value.ndim >= 2 and
                   record.value.shape == swapped_shape(t.value.shape) and same(record.value.swapaxes(-1, -2), t.value)
                   for t in theirs)

    def _trusted(self, n, record) -> list:
        """The known values a quantity of the forward side may be right by: an argument, numformer's forward, a
        value of its backward bound to a name, returned or a call's; part of an expression of its backward only for
        a value of the student's computed alike (``x * dg`` of x and numformer's dg; not ``0.5 * (1 + t)``, which
        equals numformer's ``2 * gate`` when the t of ``2 * gate - 1`` is ``4 * gate - 1``)."""
        def named(r):
            return r.variable or r.returned is not None or r.kind.startswith("call")
        return [k for k in self.knowns if k.kind != "backward" or n not in k.records or named(k.records[n])
                or self._alike_operands(n, record, k.records[n])]

    def _alike_operands(self, n, record, theirs, arrays=False) -> bool:
        """The same operation on the same values; ``arrays``: on the same arrays, the numbers aside (numformer's
        ``xp.asarray(0, dtype=ds.dtype)`` is a value of its own where the student's ``0.0`` is none)."""
        ours = [self.my_calls[n].records[i].value for i in record.operands]
        other = [self.ref_calls[n].records[i].value for i in theirs.operands]
        if arrays:
            ours, other = [v for v in ours if v.ndim], [v for v in other if v.ndim]
        return _alike(theirs.kind, record.kind) and len(ours) == len(other) and all(
            any(_equal(a, b) for b in other) for a in ours) and all(any(_equal(a, b) for a in ours) for b in other)

    def _users(self, n, index) -> list:
        """The indices of the records of call ``n`` computed from record ``index``, at any depth (names excluded)."""
        if n not in self._down:
            records, down = self.my_calls[n].records, {}
            for r in records:
                for i in _slice(self.my_calls[n], r.index) - {r.index}:
                    if r.kind != "name" and not r.given:
                        down.setdefault(i, []).append(r.index)
            self._down[n] = down
        return self._down[n].get(index, [])

    def _stacked(self, n, record) -> bool:
        """Known values side by side: ``record`` (2-d) split along an axis into two pieces, each one (x^T dy over
        the rows of the weight, and the bias' row: a column of ones appended to x)."""
        value = record.value
        if value.ndim != 2:
            return False
        for axis in (0, 1):
            for cut in range(1, value.shape[axis]):
                pieces = np.split(value, [cut], axis=axis)
                if all(any(k.values.get(n) is not None and _equal(piece, k.values[n]) for k in self.knowns)
                       for piece in pieces):
                    return True
        return False

    @staticmethod
    def _known_value(n, record, knowns, close=False) -> bool:
        if record.given:
            return True
        if record.value.ndim == 0:
            return False  # a number: known only as a size (see _sizes), never by chance equality
        for k in knowns:
            v = k.values.get(n)
            if v is not None and v.size == record.value.size and any(
                    (_close(w, v) if close else same(w, v)) for w in views(record.value, v.shape)):
                return True
        return False

    def gradient_side(self, n, record) -> bool:
        """Whether ``record`` depends on the upstream gradient (the exercise's ``upstream`` arguments): else it is a
        quantity of the forward side, the student's own definition (std = 1 / r), right unless known otherwise."""
        return any(r.given and r.code in self.upstream for r in _upstream(self.my_calls[n], [record.index]))

    def beside(self, n, record) -> list:
        """The values of the gradient side multiplying ``record`` in its statement (its co-factors, up the products
        and quotients it is in) that are neither right nor given, and the unknown values they are computed from: a
        value fitted at a factor holds only with its co-factors right (``2.0 * xc`` fitted as 2 xhat where the
        ``dvar`` beside it is wrong by a factor std: either could hold the mistake)."""
        call, out, current = self.my_calls[n], [], record
        for parent in call.records[record.index + 1:]:
            if current.index not in parent.operands or parent.statement != record.statement:
                continue
            if parent.kind not in ("Mult", "Div"):
                break
            others = [call.records[i] for i in parent.operands if i != current.index]
            out += [r for r in others + self.unknown_inputs(n, parent, operands=[o.index for o in others])
                    if not r.given and r.kind != "name" and r.key not in self.right and self.gradient_side(n, r)]
            current = parent
        return out

    def unknown_inputs(self, n, record, fixed=(), own=False, operands=None) -> list:
        """The student's records ``record`` is computed from, at any depth, that are neither right nor given nor
        of the forward side (``fixed``: keys taken as right, a fix already made): those could hold the mistake.
        ``own``: with the arrays of the forward side of the student's own on other lines that no known value is, nor
        any value computed from them (a Jacobian built from y), where the walk stops: right unless they can absorb
        the error (:func:`_diagnosis`; one beside it in its statement: :func:`_widened`)."""
        def unknown(r):
            return not (r.given or r.key in self.right or r.key in fixed or not self.gradient_side(n, r))

        def mine(r):  # a number that is a size the exercise names (mask.max(), 1/keep) is right
            return own and not (r.given or r.key in self.right or r.key in fixed) and (r.value.ndim > 0 or not any(
                all(np.allclose(k.values[m], v.value) for m, v in self.records[r.key].items())
                for k in _sizes(self, r.key)))

        def through(r):  # the student's own forward side is walked inside the statement, to the lines it reads
            return unknown(r) or (mine(r) and r.statement == record.statement)
        return [r for r in _upstream(self.my_calls[n], record.operands if operands is None else operands, through)
                if unknown(r) or (mine(r) and r.statement != record.statement)]

    def slice(self) -> list:
        """The keys of the student's records that feed a wrong returned value without passing through a right one,
        in the order the code computes them (an argument and a right record end the walk). A record depending on the
        upstream gradient bound to a name that equals the adjoint of a forward quantity is right too
        (grad_checks/adjoints.py)."""
        while True:
            found = self._walk()
            near = [key for key in found if key not in self.right and key not in self._not_adjoint
                    and self.adjoints is not None and self._bound(key) and self._adjoint_right(key)]
            if not near:
                return found
            self.right.update(near)

    def _bound(self, key) -> bool:
        """The student's value may be said to be an adjoint: it is bound to a name or returned (``dvar = ...``), a
        quantity of their route, in every call; or part of an expression whose named inputs on the gradient side
        are right (``(dxhat * xmu).sum(...)``, dL/dr from dxhat). Part of an expression of a named value not right
        (``dvar * 2.0``) may equal one by chance: the adjoints of var, std and r differ by powers of r, and a wrong
        power makes one of them."""
        def named(r):
            return r.given or r.variable or r.returned is not None
        for n, record in self.records[key].items():
            if named(record):
                continue
            inputs = _upstream(self.my_calls[n], record.operands, lambda r: not named(r))
            if any(named(r) and not r.given and r.key not in self.right and self.gradient_side(n, r) for r in inputs):
                return False
        return True

    def _adjoint_right(self, key) -> bool:
        per_call = self.records[key]
        adjoints = [] if any(r.kind == "name" for r in per_call.values()) else self.adjoints(self, key)
        if adjoints and all(self._known_value(n, r, adjoints, close=True) for n, r in per_call.items()):
            return True
        self._not_adjoint.add(key)
        return False

    def _walk(self) -> list:
        found = {}
        for n in self.wrong_calls:
            call, ref = self.my_calls[n], self.ref_calls[n]
            roots = [r.index for r in call.records if (r.returned is not None and not _right_returned(r, ref))
                     or (r.kind == "name" and r.returned is None)]  # wrong values returned, and names passed on
            for r in _upstream(call, roots, lambda r: not r.given and r.key not in self.right):
                if not r.given and (r.key not in self.right or self._recomputed(n, r)):
                    found.setdefault(r.key, (n, r.index))
        return sorted(found, key=lambda k: found[k])

    def _recomputed(self, n, record) -> bool:
        """A right value computed another way than numformer's value it equals (``1 / (1 + np.exp(x))``, which is
        numformer's ``1 - s``, computed for s): it may stand where another value belongs, and is tried with known
        values other than its own (:meth:`fits`), where it ends the walk. A right value computed as numformer's is
        (the same operation: ``d_scores * scale``) is its step, and is not."""
        call = self.my_calls[n]
        if any(call.records[i].given and record.value.size == call.records[i].value.size and np.array_equal(
                record.value.ravel(), call.records[i].value.ravel()) for i in record.operands):
            return False  # an argument with an axis added or a copy (``dy[..., :, None]``): that value itself
        equal = [k.records.get(n) for k in self.knowns if k.values.get(n) is not None
                 and _equal(record.value, k.values[n])]
        if equal and all(r is not None and r.inside is not None for r in equal):
            return True  # a value of a helper of numformer's alone (softmax_backward's dy * y): it may be part of
            # the helper's work stopped short where the helper's result belongs (``p * dp`` for dS)
        return bool(equal) and not any(r is not None and _alike(r.kind, record.kind) for r in equal)

    # -- a value tried in the student's place ---------------------------------------------------------------
    def _candidates(self, key) -> list:
        """(known, reduced, shape) for the known values that could stand where ``key`` is in every call holding it:
        as many entries (a view), the student's a reduction of it, or a shape the student's broadcasts like (the
        same axes, one of them 1 where the other is not: a row sum kept over the wrong axis)."""
        per_call = self.records[key]
        out = []
        for k in self.knowns + (self.adjoints(self, key) if self.adjoints else []):
            if any(n not in k.values for n in per_call if n in self.wrong_calls) or not any(n in k.values
                                                                                            for n in per_call):
                continue
            how, shape = "", ""
            for n, r in per_call.items():
                if n not in k.values or r.value.size == k.values[n].size:
                    continue
                how = how or reduced(r.value, k.values[n]) or ""
                if not how and _broadcasts_alike(r.value.shape, k.values[n].shape):
                    shape = f"it has shape {r.value.shape}, {k.label}'s {k.values[n].shape}" + (
                        "" if r.value.ndim == k.values[n].ndim else f": it lacks {_axes(k.values[n].ndim - r.value.ndim)}")
                theirs = k.records.get(n) if k.kind == "backward" else None
                if not how and not shape and theirs is not None and r.kind == theirs.kind and r.kind in REDUCTIONS \
                        and self._alike_operands(n, r, theirs, True):  # (dy * xhat).sum(axis=1) for its axis=0
                    shape = f"it has shape {r.value.shape}, numformer's {k.values[n].shape}"
                if not how and not shape:
                    break
            else:
                out.append((k, how, shape))
        return out + [(k, "", "") for k in _sizes(self, key)]

    def fits(self, key, base=None) -> _Fix | None:
        """The first known value that, in ``key``'s place (with the fixes ``base`` made), makes every gradient right:
        one of them as it is; else, for a quantity of the forward side, a multiple of one the student's route needs,
        one factor per case (the gradients are affine in such a value where the route is linear in it: the replay
        with zero there and the one with the known value give the line, a third checks the fit). A fix that puts right every tensor it changes while another stays wrong is
        kept in ``partial``: one of two mistakes on separate tensors."""
        base, tried, right = base or {}, [], key in self.right
        # a multiple only for a quantity of the forward side (a route's own constant: (1 - t)^2 is 2 times numformer's
        # 2 g (1 - g)); a gradient of the route is its known value itself (a multiple of dL/d std would compensate a
        # wrong power of var + eps in the same product)
        gradient = self.gradient_side(*next(iter(self.records[key].items())))
        # a value equal to one of numformer's, trusted or not (``1 - gate``), is no multiple of another: scaling it
        # would compensate a factor missing beside it
        equal = all(self._known_value(n, r, self.knowns) for n, r in self.records[key].items())
        for known, how, shape in self._candidates(key):
            if right and (how or shape or known.kind == "size" or all(
                    _equal(r.value, known.values[n]) for n, r in self.records[key].items() if n in known.values)):
                continue  # a right value: only another value of the same shape can show it stands in the wrong place
            fix = _Fix(key, known, None, how, shape)
            got = self.proof.students({**base, **fix.values(self)})
            if self.proof.right(got):
                return fix if self._alone(key, fix, base) else None
            if not base and self._puts_right(got):
                self.partial.append(fix)
            if not (how or shape or known.kind == "size" or self.target is None or right or gradient or equal):
                tried.append((fix, got))
        zero = None
        for fix, got in tried:
            if zero is None:
                zero = _flat(self.proof.students({**base, **{k: 0 * v for k, v in fix.values(self).items()}}),
                             self.names)
            c = self._factor(zero, _flat(got, self.names))
            if c is not None:
                fix = _Fix(key, fix.known, c)
                if self.proof.right(self.proof.students({**base, **fix.values(self)})):
                    return fix
        return None

    def solved(self, key) -> _Fix | None:
        """A named quantity of the student's own forward side that no known value is (``t = np.tanh(...)``, their own
        tanh), solved from a later value of theirs that is affine in it and must be a known one (``1.0 + t``, 2 gate):
        the value the rest of their code needs there, (K - R(0)) / (R(1) - R(0)) entry by entry, with which every
        gradient is right, its other uses (``t ** 2``) then right as well. Not for a value read once (solved from its
        one use, it is whatever that use absorbs: ``q`` of ``-q / p``, right, where the use is wrong); not where that value is a multiple of theirs (a
        sign or a factor the later line may hold: ``1.0 - t`` where ``1.0 + t`` belongs solves t to -t), nor where
        the later value is not affine in it, nor past another named quantity of theirs. None when none is found."""
        per_call = self.records[key]
        calls = [n for n in per_call if n in self.wrong_calls]
        if not calls or key in self.right or any(
                r.given or r.kind in _PASSING or not r.variable or r.value.ndim == 0 or self.gradient_side(n, r)
                for n, r in per_call.items()):
            return None
        replays = []
        for v in (0.0, 1.0, 2.0):
            got, _ = self.proof.students({(n, key): np.full(r.value.shape, v) for n, r in per_call.items()}, calls=True)
            if got is None or len(got) != len(self.my_calls):
                return None
            replays.append(got)
        n0 = calls[0]
        first, call = per_call[n0], self.my_calls[n0]
        def readers(i):  # the records computed from record i directly (through a name read: what reads that)
            return {j for r in call.records if i in r.operands
                    for j in (readers(r.index) if r.kind in _PASSING else {r.index})}
        if len(readers(first.index)) < 2:
            return None  # read once: a value solved from its one use is whatever that use absorbs (``-q / p``)
        users = [r for r in call.records[first.index + 1:] if r.value.shape == first.value.shape and not r.given
                 and r.kind not in _PASSING and any(u.index == first.index for u in _upstream(call, r.operands))]
        for user in users[:6]:
            between = [r for r in _upstream(call, user.operands) if r.index > first.index and r.variable
                       and r.kind not in _PASSING and any(u.index == first.index for u in _upstream(call, r.operands))]
            if between:
                break  # another named quantity of theirs on the way (``q`` from the one-hot ``target``): either
                # could hold the mistake, solved for the nearer one (when it is the key)
            affine = {}
            for m, mine in per_call.items():
                got = [next((r.value for r in c[m].records if r.key == user.key), None) for c in replays]
                if any(v is None or v.shape != mine.value.shape for v in got):
                    break
                r0, r1, r2 = got
                a = r1 - r0
                if not (np.all(np.abs(a) > 1e-9 * max(1.0, float(np.abs(r0).max()))) and same(r2, r0 + 2 * a)):
                    break
                affine[m] = (r0, a)
            else:
                for k in self.knowns:
                    if k.kind == "size" or any(m not in k.values or k.values[m].shape != per_call[m].value.shape
                                               for m in per_call):
                        continue
                    want = {m: (k.values[m] - r0) / a for m, (r0, a) in affine.items()}
                    if any(same(per_call[m].value, want[m]) or factor(per_call[m].value, want[m]) is not None
                           for m in calls):
                        continue
                    label = f"the value with which your `{user.code}` is {_named(k, user.code, user.variable)}"
                    fix = _Fix(key, Known("solved", want, label, ""))
                    if self.proof.right(self.proof.students(fix.values(self))) and self.consistent([fix]):
                        return fix
        return None

    def consistent(self, fixes) -> bool:
        """With ``fixes`` made, every other value of the student's that was right (a known value) is still one: a fix
        that makes every gradient right by turning a right value wrong is a compensation (x - mu replaced by xhat
        puts a wrong dvar right and dL/d std wrong), not the mistake."""
        overrides = {k: v for f in fixes for k, v in f.values(self).items()}
        calls, _ = self.proof.students(overrides, calls=True)
        if calls is None or len(calls) != len(self.my_calls):
            return False
        fixed = {f.key for f in fixes}
        for n, call in enumerate(calls):
            for r in call.records:
                if r.given or r.kind == "name" or r.key in fixed or r.key not in self.right or r.value.ndim == 0:
                    continue
                before = self.records[r.key].get(n)
                if before is not None and before.value.shape == r.value.shape and same(r.value, before.value):
                    continue  # as it was (a quantity of the forward side right by its use: no known value to be)
                if not (self._known_value(n, r, self.knowns) or self._stacked(n, r) or (
                        self.adjoints is not None and self._known_value(n, r, self.adjoints(self, r.key), True))):
                    return False
        return True

    def _alone(self, key, fix, base) -> bool:
        """No other known value of another value makes every gradient right in ``key``'s place as well: the value
        it must hold is pinned (checked unique among the known ones), not one of many the rest of the code takes.
        The adjoint of the forward quantity there pins it by itself: what the value must be, whatever the code after
        it takes (dL/d xhat for a dxhat the later code takes up to a constant a row)."""
        calls = [n for n in self.records[key] if n in fix.known.values]
        adjoints = self.adjoints(self, key) if self.adjoints else []
        if any(all(n in a.values and _close(fix.known.values[n], a.values[n]) for n in calls) for a in adjoints):
            return True
        for known, how, shape in self._candidates(key):
            if known is fix.known or how or shape or any(
                    _equal(known.values[n], fix.known.values[n]) for n in calls if n in known.values) or \
                    self._computed_from(known, fix.known, calls):
                continue  # (numformer's value computed from it: dS masked, where dS is what is found)
            if self.proof.right(self.proof.students({**base, **_Fix(key, known).values(self)})):
                return False
        return True

    def _computed_from(self, known, base, calls) -> bool:
        """numformer's record of ``known`` is computed from that of ``base`` in every call (``where(masked, 0, ds)``
        from ``ds``): two values of one chain of numformer's, the later a function of the earlier."""
        if known.kind != "backward" or base.kind != "backward":
            return False  # (the forward's records are of other calls)
        for n in calls:
            mine, theirs = known.records.get(n), base.records.get(n)
            if mine is None or theirs is None or not any(
                    r is theirs for r in _upstream(self.ref_calls[n], mine.operands)):
                return False
        return bool(calls)

    def _puts_right(self, got) -> bool:
        """Every graded tensor the replay changed is right now, and some other is still wrong: a fix of one of two
        mistakes on separate tensors (dW and db read from the wrong rows)."""
        right, same_as_mine = self.proof.agreeing(got), self.proof.agreeing(got, self._as_returned)
        if any(v is None for v in right):
            return False
        if any(v is None for v in same_as_mine):  # the student's raised in numformer's layer (a dgamma of another
            # shape added into the weight's): what it changes is unknown, a fix that runs, some tensor right, is one
            return all(self.proof.mine[k].grads is None for k, v in enumerate(same_as_mine) if v is None) and any(
                a.all() for v in right for a in v.values()) and not all(a.all() for v in right for a in v.values())
        pairs = [(r[name].all(), m[name].all()) for r, m in zip(right, same_as_mine) for name in r]
        return all(ok for ok, unchanged in pairs if not unchanged) and any(not unchanged for _, unchanged in pairs) \
            and not all(ok for ok, _ in pairs)

    @cached_property
    def _as_returned(self) -> list:
        """The student's outcomes as the code returns them: the grading's where every case returned its shapes, else
        a replay with nothing changed (the replays do not guard shapes: a dgamma of the wrong shape is compared as it
        is, the others beside it too)."""
        mine = self.proof.mine
        return mine if all(m.grads is not None or not m.ran for m in mine) else self.proof.students({})

    def _factor(self, zero, one) -> dict | None:
        """{case: c}, the line zero + c (one - zero) through two replays' gradients fitted to numformer's in each
        case, when it reaches them all (to the tolerance), c not 1 somewhere; else None."""
        if zero is None or one is None:
            return None
        out, start = {}, 0
        for k, names in enumerate(self.names):
            ref = self.proof.reference[k].grads
            end = start + sum(int(np.size(ref[nm])) for nm in names)
            slope, target = one[start:end] - zero[start:end], self.target[start:end]
            if slope.any():
                out[k] = float(slope @ (target - zero[start:end]) / (slope @ slope))
                if not _agree(zero[start:end] + out[k] * slope, target, floor(ref)).all():
                    return None
            elif not _agree(zero[start:end], target, floor(ref)).all():
                return None
            start = end
        if not out or all(abs(c - 1.0) <= 1e-9 for c in out.values()) or any(abs(c) <= 1e-12 for c in out.values()):
            return None
        return out

    def scaled(self, key) -> list:
        """Fixes putting a known value where the student's is a multiple of it (c not 1, one c in a call): values
        numformer's code computes before the arguments (``dy / scale`` is a multiple of ``dy * scale`` and of dy)."""
        per_call = self.records[key]
        found = [(i, _Fix(key, k)) for i, k in enumerate(self.knowns)
                 if _multiples(per_call, k, self.wrong_calls) is not None]
        return [f for _, f in sorted(found, key=lambda f: (f[1].known.kind == "argument", -f[0]))]

    def wrong_entries(self, outcomes) -> int | None:
        """How many graded entries of ``outcomes`` are wrong, over every case (None: one did not run)."""
        got = self.proof.agreeing(outcomes)
        return None if any(v is None for v in got) else sum(int((~a).sum()) for v in got for a in v.values())

    # -- what else could hold the mistake ----------------------------------------------------------------------
    def jacobian(self, key):
        """(call, case, J, rest): the graded gradients of the smallest wrong case holding ``key`` as a function of
        its value there, by one replay an entry (exact where the code after it is affine in it, as a backward is in
        a gradient); ``rest`` what J must reach (numformer's gradients minus the student's). None past 256 entries."""
        calls = [n for n in self.records[key] if n in self.wrong_calls]
        n = min(calls, key=lambda m: self.records[key][m].value.size) if calls else None
        if n is None or self.records[key][n].value.size > 256:
            return None
        value, case = self.records[key][n].value, self.my_calls[n].case
        base = _flat(self.proof.students({}, case=case), self.names, [case])
        target = _flat(self.proof.reference, self.names, [case])
        h, columns = max(float(np.abs(value).max()), 1.0), []
        for j in range(value.size):
            moved = value.copy()
            moved.flat[j] += h
            columns.append(_flat(self.proof.students({(n, key): moved}, case=case), self.names, [case]))
        if base is None or target is None or any(c is None for c in columns):
            return None
        return n, case, (np.stack(columns, axis=1) - base[:, None]) / h, target - base

    def positions(self, n, record) -> list:
        """The student's integer or boolean arrays (``starts = np.flatnonzero(np.diff(sorted_ids)) + 1``, ``counts =
        np.bincount(ids)``) that ``record``'s statement, or one it is computed from, reads and that could absorb the
        error (:meth:`_position_absorbs`), as stand-ins with their lines; a mask that is where an argument or a
        known value is nonzero (or positive) is right and left out."""
        call, nodes = self.my_calls[n], _RECORDED[self.proof.answer][self.ex.name][0].nodes.values()
        lines = {call.records[i].statement for i in _slice(call, record.index)} - {None}
        out = []
        for name, (line, value) in call.indices.items():
            if value.ndim == 0:
                continue  # a count (tokens = np.count_nonzero(w)): right unless another size is needed (_count)
            if line is None or line in lines or not any(name in node.names for node in nodes if node.statement in lines):
                continue
            if value.dtype == bool and any(v is not None and v.shape == value.shape and (
                    np.array_equal(v != 0, value) or np.array_equal(v > 0, value))
                    for v in [k.values.get(n) for k in self.knowns]):
                continue
            if self._position_absorbs(name):
                out.append(_Position(name, line))
        return out

    def _position_absorbs(self, name) -> bool:
        """Whether one small change of the positions ``name`` holds (in every call binding it) makes every gradient
        right: all ones or zeros (all True or False), one more or one less each, a 0 put first, the first one
        dropped. Then its line could hold the mistake (counts of 1 and no division; starts from 0)."""
        calls = [n for n, c in enumerate(self.my_calls) if name in c.indices]
        for change in (np.ones_like, np.zeros_like, lambda v: v + 1, lambda v: v - 1,
                       lambda v: np.concatenate([np.zeros(1, v.dtype), v]) if v.ndim == 1 else None,
                       lambda v: v[1:] if v.ndim == 1 else None):
            overrides = {}
            for n in calls:
                changed = change(self.my_calls[n].indices[name][1])
                if changed is not None:
                    overrides[(n, ("position", name))] = changed
            if overrides and self.proof.right(self.proof.students(overrides)):
                return True
        return False

    def known_shape(self, record) -> bool:
        """Some known value has ``record``'s shape (in its call), or as many entries."""
        n = next((m for m, r in self.records.get(record.key, {}).items() if r is record), 0)
        return any(k.values.get(n) is not None and k.values[n].size == record.value.size for k in self.knowns)

    def absorbs(self, key) -> bool:
        """Whether some value in ``key``'s place, the rest of the student's code as written, makes every gradient
        of the smallest wrong case right (least squares on :meth:`jacobian`). Too big to probe: not when its one
        consumer cannot (all it changes goes through that), else assumed it can."""
        if key not in self._absorbing:
            self._absorbing[key] = True  # (a cycle of names cannot occur; a guard all the same)
            got = self.jacobian(key)
            if got is not None:
                _, case, jac, rest = got
                delta, *_ = np.linalg.lstsq(jac, rest, rcond=None)
                self._absorbing[key] = bool(_agree(jac @ delta, rest, floor(self.proof.reference[case].grads)).all())
            else:
                n, record = _first(self, key)
                users = [r for r in self.my_calls[n].records if record.index in r.operands]
                self._absorbing[key] = len(users) != 1 or self.absorbs(users[0].key)
        return self._absorbing[key]


_PASSING = ("name", "IfExp")  # records passing a value on (a name read, a conditional's branch): no computation
REDUCTIONS = ("sum", "mean", "max", "min", "prod")  # the kinds of the records of reductions (``x.sum(axis=0)``)


def _multiples(per_call, known, wrong_calls) -> list | None:
    """[c per call] when the student's value is c times the known one in every call holding both (1 where equal,
    some c not 1), the known value in every wrong call; else None."""
    calls = [n for n in per_call if n in known.values]
    if not calls or any(n in wrong_calls for n in per_call if n not in known.values):
        return None
    out = []
    for n in calls:
        mine, theirs = per_call[n].value, known.values[n]
        if mine.shape != theirs.shape:
            return None
        if not theirs.any() and not mine.any():
            continue  # both zero (a row of one entry): any factor fits, none is said
        c = 1.0 if same(mine, theirs) else factor(mine, theirs)
        if c is None:
            return None
        out.append(c)
    return out if any(c != 1.0 for c in out) else None


@dataclass
class _Position:
    """A stand-in for an integer or boolean array of the student's among a step's suspects: its name and line."""

    code: str
    statement: int
    line: int = 0
    key: tuple = ()

    def __post_init__(self):
        self.line, self.key = self.statement, ("position", self.code)


def _broadcasts_alike(a: tuple, b: tuple) -> bool:
    """A row statistic kept over another axis: the same axes, each of the two shapes with a 1 where the other has not
    ((B, h, 1, Tk) for (B, h, Tq, 1)); or fewer axes that broadcast to the other's (a gain (d,) where dy * gamma
    (n, d) belongs)."""
    if len(a) < len(b):
        return len(a) > 0 and b[len(b) - len(a):] == a
    return len(a) == len(b) and a != b and all(x == y or x == 1 or y == 1 for x, y in zip(a, b)) and \
        any(x == 1 != y for x, y in zip(a, b)) and any(y == 1 != x for x, y in zip(a, b))


def _axes(k: int) -> str:
    return "its leading axis" if k == 1 else f"its {k} leading axes"


def _right_returned(record, ref_call) -> bool:
    """The student's returned value equals numformer's at the same place, as returned (a transposed dW is wrong)."""
    theirs = next((r for r in ref_call.records if r.returned == record.returned), None)
    return theirs is not None and theirs.value.shape == record.value.shape and same(record.value, theirs.value)


def first_wrong_steps(ex, answer, seed: int = 0, file=None, time_limit=None, recordings=None,
                      budget: float = None) -> list:
    """The :class:`WrongStep` s of ``answer`` (a function or a layer class), at most :data:`MOST`; [] when its code or
    numformer's cannot be recorded, or the calls do not line up. ``recordings``: the two runs already recorded
    (:class:`Recordings`); ``budget``: the replays' seconds (:data:`SEARCH_BUDGET` when None)."""
    recordings = recordings or Recordings(ex, answer, seed, file, time_limit)
    my_calls, mine = recordings.student
    if not my_calls:
        return []
    ref_calls, reference = recordings.reference
    if ref_calls and len(ref_calls) != len(my_calls) and recordings.guard:
        # a wrong shape returned cut a case short (the guard's error): recorded again unguarded, its calls aligned
        recordings = Recordings(ex, answer, seed, file, time_limit, guard=False)
        my_calls, mine = recordings.student
    if not ref_calls or len(ref_calls) != len(my_calls):
        return []
    proof = _Proof(ex, answer, seed, file, time_limit, mine, reference, SEARCH_BUDGET if budget is None else budget)
    engine = _Engine(ex, proof, my_calls, ref_calls, recordings.forward, adjoints(recordings))
    try:
        return _diagnosis(engine)
    except _Stopped:
        stopped = (f"; the search for the step stopped at its budget ({proof.budget:.3g} s of replays): this is "
                   "what it had")
        return [replace(s, said=s.said + stopped) for s in _outputs(engine)][:MOST]


def _passed_steps(ex, proof) -> list:
    """The calls handing a child another sub-layer than numformer's (grad_checks/sublayers_passed.py), as steps."""
    return [WrongStep(f"self.{want}", f"self.{want}", None, line, None, None,
                      f"first wrong step: your line {line} (`{code}`) passes `self.{have}` where numformer's passes "
                      f"`self.{want}`, the sub-layer that call runs (with it there every gradient is right)")
            for line, code, have, want in sublayers_passed(ex, proof)]


def raising_steps(ex, answer, seed, file, time_limit, mine, reference) -> list:
    """The steps of code that raised in every case, where an edit proves them: a child handed another sub-layer
    (the feed-forward's backward run twice finds nothing saved the second time)."""
    if not ex.is_method:
        return []
    proof = _Proof(ex, answer, seed, file, time_limit, mine, reference, SEARCH_BUDGET)
    try:
        return _passed_steps(ex, proof)
    except _Stopped:
        return []


def precision_steps(recordings) -> list:
    """[the float32 step] when the student's recorded lines compute in float32 or float16 in the float64 check (an
    answer graded APPROXIMATE, which no replay is needed to place: the dtypes its lines produce say where), else []."""
    calls, _ = recordings.student
    step = _float32(calls) if calls else None
    return [] if step is None else [step]


def _diagnosis(engine) -> list:
    """The steps, by the rules of the module's docstring, in their order of preference."""
    float32 = _float32(engine.my_calls)
    if float32 is not None:
        return [float32]
    count = _count(engine) or _mask(engine)
    if count is not None:
        return [count]
    dropped = _overwritten(engine)
    if dropped is not None:
        return [dropped]
    swapped = _swapped(engine)
    if swapped:
        return swapped
    passed = _passed_steps(engine.ex, engine.proof)
    if passed:
        return passed
    keys = engine.slice()
    found = []  # (fix, call, the student's record there, its unknown inputs that could absorb the error)
    for key in keys:
        fix = engine.fits(key) or engine.solved(key)
        if fix is None:
            continue
        n, record = _first(engine, key)
        if not engine.consistent([fix]):
            continue
        fix, record = _widened(engine, fix, n, record)
        # an input that cannot absorb the error (no value of its shape there puts every gradient right) holds no
        # mistake of its own, unless its shape is one no known value has (the mistake may be that shape); positions
        # the student computed (starts, order) are inputs no value can be put in the place of: they stay suspects
        unknown = [u for u in engine.unknown_inputs(n, record, own=True) if u.statement == record.statement
                   or engine.absorbs(u.key) or not engine.known_shape(u)] + engine.positions(n, record)
        unknown += [u for u in engine.beside(n, record) if u not in unknown and engine.absorbs(u.key)]
        found.append((fix, n, record, unknown))
        passed_on = _passed_on(engine, fix, record, unknown) if unknown else None
        if passed_on is not None:
            return [passed_on]
        if not unknown:  # the first wrong step: a value known there, every input right; or two, an input's first
            return _said(engine, _missing(engine, n, record) or _before(engine, fix, n, record) or [fix])
    two = _two(engine, keys)
    if two:
        return _said(engine, two)
    inside = [f for f in found if all(u.statement == f[2].statement for u in f[3])]
    if inside:  # its inputs unknown only inside its own statement: the smallest expression of it known named
        statement = inside[0][2].statement
        fix, n, record, _ = min((f for f in inside if f[2].statement == statement),  # a value itself first
                                key=lambda f: (f[0].c is not None, len(f[2].code)))
        return _said(engine, _missing(engine, n, record) or _before(engine, fix, n, record) or [fix])
    two = _two_known(engine, keys)
    if two:
        return _said(engine, two)
    if found:  # compensation: the lines its unknown inputs are on could absorb the error as well
        return [_together(engine, *found[0])]
    return _outputs(engine)[:MOST]


def _passed_on(engine, fix, record, unknown) -> WrongStep | None:
    """The step at the statement a name passes on (``return grad`` after ``for t, i in enumerate(ids): grad[i] +=
    dy[t]``) when the value is fitted at the name and every input that could absorb the error is on that
    statement, whose inputs from other lines are right, in every wrong call: a name holds what it is bound to, so
    the statement is the first wrong step. Only where the statement's value has no one key in every call (a loop's
    records are one per row: its last is another in each call, so the fit is found at the name). None otherwise."""
    if record.kind != "name" or len(record.operands) != 1:
        return None
    per_call = {}
    for m, mine in engine.records[fix.key].items():
        if m not in engine.wrong_calls:
            continue
        bound = engine.my_calls[m].records[mine.operands[0]] if len(mine.operands) == 1 else None
        if bound is None or bound.given or not _equal(bound.value, mine.value) or bound.statement == mine.statement:
            return None
        per_call[m] = bound
    statements = {b.statement for b in per_call.values()}
    if len(statements) != 1 or any(u.statement not in statements for u in unknown) or \
            len({b.key for b in per_call.values()}) == 1:
        return None  # (one key in every call: the statement's value is fitted itself, or found as one of two)
    for m, bound in per_call.items():  # its inputs from other lines right: the step is the statement's own
        if any(u.statement != bound.statement for u in engine.unknown_inputs(m, bound, own=True)) or \
                engine.positions(m, bound):
            return None
    n = min(per_call)
    return _step(engine, fix, n, per_call[n], per_call=per_call)


def _widened(engine, fix, n, record) -> tuple:
    """(fix, record) again, or of an expression of its statement around it, when a term beside it could absorb the
    error as well: the largest product around a multiple fitted, or a value a multiple of the known one put there
    (a factor missing or extra: ``0.5 * x * ... * du * 0.5``,
    half numformer's x * dg, where each factor could take it, not the first of them), where another of its factors
    admits a multiple too, or is of the student's own forward side and right by nothing; and the smallest
    expression with a known value holding a quantity of the student's own forward side beside it (``dxhat * xmu``
    with numformer's ``dxhat * xhat`` put right by ``r ** 2`` where ``r ** 3`` belongs: dL/d(var) named)."""
    call = engine.my_calls[n]

    def parents(r, kinds=None):
        while True:
            r = next((p for p in call.records[r.index + 1:] if r.index in p.operands
                      and p.statement == record.statement and (kinds is None or p.kind in kinds)), None)
            if r is None:
                return
            yield r

    def own(o):
        return not o.given and o.key not in engine.right and not engine.gradient_side(n, o)

    def scaled(f, key):  # a multiple fitted, or a value a multiple of the known one put there
        return f is not None and (f.c is not None or _multiples(engine.records[key], f.known, engine.wrong_calls)
                                  is not None)

    if scaled(fix, record.key):
        chain, current = [], record
        for parent in parents(record, ("Mult", "Div")):
            chain += [call.records[i] for i in parent.operands if i != current.index]
            current = parent
        if any(own(o) and (o.value.ndim == 0 or scaled(engine.fits(o.key), o.key)) for o in chain):
            for top in reversed([p for p in parents(record, ("Mult", "Div"))]):
                wide = engine.fits(top.key)
                if wide is not None and engine.consistent([wide]):
                    return wide, top
        return fix, record
    current = record
    for parent in parents(record):
        beside = [call.records[i] for i in parent.operands if i != current.index]
        if any(o.statement == record.statement and own(o) and engine.absorbs(o.key) for o in beside):
            wide = engine.fits(parent.key)
            if wide is not None and engine.consistent([wide]):
                return wide, parent
        current = parent
    return fix, record


def _first(engine, key) -> tuple:
    """(call number, the student's record of ``key``) in the first wrong call holding it, else the first call."""
    per_call = engine.records[key]
    n = next((n for n in engine.wrong_calls if n in per_call), next(iter(per_call)))
    return n, per_call[n]


def _two(engine, keys) -> list:
    """Two mistakes, each with right inputs (the other one made), in the order computed; [] when none:

    * two values that are each a multiple of a known one, neither enough alone, that together make every gradient
      right (sums where two means belong);
    * two fixes each putting right the tensors it changes, together all (dW and db read from the wrong rows).
    (A multiple fixed first, then the step it feeds: :func:`_before`.)"""
    scaled = [f for key in keys for f in engine.scaled(key)[:1]][:6]
    alone = {id(f): engine.proof.right(engine.proof.students(f.values(engine))) for f in scaled}
    for i, a in enumerate(scaled):
        for b in scaled[i + 1:]:
            if a.key == b.key or alone[id(a)] or alone[id(b)]:
                continue
            if engine.proof.right(engine.proof.students({**a.values(engine), **b.values(engine)})) and \
                    _inputs_right(engine, a, b):
                return [a, b]
    for i, a in enumerate(engine.partial):
        for b in engine.partial[i + 1:]:
            if a.key != b.key and _inputs_right(engine, a, b) and engine.proof.right(
                    engine.proof.students({**a.values(engine), **b.values(engine)})):
                return sorted([a, b], key=lambda f: _first(engine, f.key)[1].index)
    for a in engine.partial[:2]:  # the other one found with the first made (alone it raised: dx wrong beside a
        # dgamma of another shape, which the layer cannot add into its weight's)
        b = _second(engine, a.values(engine), [k for k in keys if k != a.key],
                    lambda b, a=a: _inputs_right(engine, a, b) and engine.consistent([a, b]))
        if b is not None:
            return sorted([a, b], key=lambda f: _first(engine, f.key)[1].index)
    return []


def _second(engine, base, keys, inputs_right):
    """The first of ``keys`` that is a first wrong step with the fix ``base`` made (:meth:`_Engine.fits` on top of
    it) and whose inputs ``inputs_right(fix)`` says are right: the second of two mistakes; None when none is. (Each
    caller judges the inputs its own way: two partial fixes, a swap, a known value put first.)"""
    for key in keys:
        fix = engine.fits(key, base=base)
        if fix is not None and inputs_right(fix):
            return fix
    return None


TWO_FIRST = 8     # the student's earliest values tried as the first of two mistakes (each with its 2 nearest knowns)


def _two_known(engine, keys) -> list:
    """Two mistakes, each a known value with right inputs: an early value of the student's put to a known value of its
    shape computed by the same operation from the same values (the two nearest to it tried: a search order, never the proof) leaves the answer wrong, and then a later
    value is a first wrong step of what remains (:meth:`_Engine.fits` with the first made, its inputs known values in
    that replay, not without it); the first alone leaves the answer wrong, both together put it right, and no right
    value turns wrong. []
    when none (``p + eps / V`` for ``p - eps / V`` and a division by the weights' sum, each hiding the other)."""
    for a_key in [k for k in keys if k not in engine.right][:TWO_FIRST]:
        n, record = _first(engine, a_key)
        # the numbers aside, or a step left out, only on the gradient side (``0.5 * x`` is no ``3 * K * x``)
        loose = engine.gradient_side(n, record)
        # the first is numformer's counterpart: the same operation on the same values (``p + eps / V`` for ``p - eps / V``)
        # (or numformer's value of the student's name: ``dxhat = dy`` where numformer's dxhat is dy * gamma)
        near = sorted((k for k, how, shape in engine._candidates(a_key) if not how and not shape and k.kind != "size"
                       and k.kind == "backward" and n in k.records and (engine._alike_operands(
                           n, record, k.records[n]) or loose and (engine._alike_operands(n, record, k.records[n], True)
                                                                  or _one_step(engine, n, record, k)))
                       and all(m in k.values and k.values[m].shape == r.value.shape and not _equal(r.value, k.values[m])
                               for m, r in engine.records[a_key].items() if m in engine.wrong_calls)),
                      key=lambda k: float(np.abs(k.values[n] - record.value).sum()))
        for known in near[:2]:
            a = _Fix(a_key, known)
            base = a.values(engine)
            calls, got = engine.proof.students(base, calls=True)
            if calls is None or len(calls) != len(engine.my_calls) or engine.proof.right(got):
                continue  # alone it puts everything right: a single mistake (said elsewhere), or it did not run
            still = {m for m, c in enumerate(engine.my_calls) if c.returned and not engine.proof.right(got, [c.case])}
            # the second is in every call the first leaves wrong, and later; not a first wrong step by itself, its
            # inputs right as they are (unless one is the first's, a known value in the wrong place: ``dxhat = dy``
            # where dy * gamma belongs); its inputs known values with the first made
            b = _second(engine, base, [k for k in keys if k != a_key and _first(engine, k)[1].index > record.index
                                       and still <= set(engine.records[k])],
                        lambda b, a=a, calls=calls: not (_known_inputs(engine, engine.my_calls, b.key) and (
                            b.c is not None or not _reads(engine, b.key, a.key)))
                        and _known_inputs(engine, calls, b.key) and engine.consistent([a, b]))
            if b is not None:
                return [a, b]
    return []


def _one_step(engine, n, record, known) -> bool:
    """The student's name bound to an argument as it is (``g_hat = dy``) where numformer's value is one operation
    on that argument (``dxhat = dy * gamma``): the counterpart of a step left out, in call ``n``."""
    mine = [engine.my_calls[n].records[i] for i in record.operands]
    theirs = [engine.ref_calls[n].records[i] for i in known.records[n].operands]
    return record.kind == "name" and len(mine) == 1 and mine[0].given and any(
        r.given and r.code == mine[0].code for r in theirs)


def _reads(engine, key, other) -> bool:
    """Whether ``key``'s value is computed from ``other``'s in every call holding it."""
    return all(any(r.key == other for r in _upstream(engine.my_calls[m], mine.operands))
               for m, mine in engine.records[key].items())


def _known_inputs(engine, calls, key) -> bool:
    """In the replayed ``calls``, every operand of ``key``'s records from another statement, on the gradient side,
    is a known value or an argument (the first mistake made: the second's inputs are right; one of its own statement
    is part of the step named)."""
    for m, mine in engine.records[key].items():
        replayed = next((r for r in calls[m].records if r.key == key), None)
        if replayed is None:
            return False
        for i in replayed.operands:
            o = calls[m].records[i]
            if not (o.given or o.statement == replayed.statement or i >= len(engine.my_calls[m].records) or not engine.gradient_side(m, engine.my_calls[m].records[i])
                    or engine._known_value(m, o, engine.knowns) or o.kind == "name"
                    and all(engine._known_value(m, calls[m].records[j], engine.knowns) for j in o.operands)):
                return False
    return True


def _before(engine, fix, n, record) -> list:
    """[a, the fix again with a made] when an input of ``record`` is a multiple of a known value whose fix leaves
    fewer entries wrong (``dy / scale`` where ``dy * scale`` belongs, feeding the scatter found): a mistake before it;
    else []."""
    before = engine.wrong_entries(engine.proof.mine)
    call = engine.my_calls[n]
    inputs = {call.records[i].key for i in _slice(call, record.index) if call.records[i].key not in engine.right
              and not call.records[i].given and engine.gradient_side(n, call.records[i])} - {record.key}
    for key in sorted(inputs, key=lambda k: _first(engine, k)[1].index):
        for a in engine.scaled(key)[:1]:
            after = engine.wrong_entries(engine.proof.students(a.values(engine)))
            b = None if before is None or after is None or after >= before else \
                engine.fits(fix.key, base=a.values(engine))
            if b is not None and _inputs_right(engine, a, b):
                return [a, b]
    return []


def _missing(engine, n, record) -> list:
    """A step of numformer's missing after a right input of ``record`` (itself wrong): the student's value is
    numformer's A, and the code after it needs numformer's B, computed from A (``dropout_backward(dp)`` from ``dp``),
    which no value of the student's holds: B there makes every gradient right. Then that input's line holds A where B
    belongs (B one of numformer's next values bound to a name or returned, the nearest first): [that fix]; else []."""
    call, ref = engine.my_calls[n], engine.ref_calls[n]
    if record.key in engine.right:
        return []  # the step's own value is numformer's A: said there ("yours is numformer's ...")
    held = lambda v: any(not s.given and _equal(s.value, v) for s in call.records)  # noqa: E731
    for r in sorted(_upstream(call, record.operands, lambda r: r.key not in engine.right), key=lambda r: r.index):
        if r.given or r.kind == "name" or r.key not in engine.right:
            continue
        shapes = {m: mine.value.shape for m, mine in engine.records[r.key].items() if m in engine.wrong_calls}
        for a in [k for k in engine.knowns if k.kind == "backward" and n in k.records and _equal(r.value, k.values[n])]:
            if _final_name(ref, a.records[n], r.variable):
                continue  # the student's name holds numformer's value of that name (``dx``, w_q's): the step
                # missing is the reader's (``return dx`` where numformer's returns ``dx + dkv``), said there
            after = [b for b in engine.knowns if b.kind == "backward" and b is not a and n in b.records
                     and (b.records[n].variable or b.records[n].returned is not None)
                     and all(m in b.values and b.values[m].shape == shape for m, shape in shapes.items())
                     and a.records[n].index in _slice(ref, b.records[n].index) and not held(b.values[n])]
            for b in sorted(after, key=lambda b: b.records[n].index)[:3]:
                fix = _Fix(r.key, b, after=a)
                if engine.proof.right(engine.proof.students(fix.values(engine))) and engine.consistent([fix]):
                    return [fix]
    return []


def _final_name(ref_call, theirs, variable) -> bool:
    """numformer's record ``theirs`` is bound to ``variable`` and the name is not bound again after it (``dx =
    self.w_q.backward(...)`` then ``return dx + dkv``; not ``dp = dout @ v^T`` then ``dp = dropout_backward(dp)``):
    the student's ``variable`` holding that value holds what numformer's name does."""
    return bool(variable) and theirs.variable == variable and not any(
        r.variable == variable for r in ref_call.records[theirs.index + 1:] if r.kind != "name")


def _inputs_right(engine, a, b) -> bool:
    return all(not engine.unknown_inputs(*_first(engine, f.key), fixed={a.key, b.key}) for f in (a, b))


# -- the sentences ---------------------------------------------------------------------------------------------------

def _said(engine, fixes) -> list:
    """The steps of ``fixes``, each said as the student's code computes it once the fixes before it are made (the
    repeated ids lost, said once the scale is right)."""
    out, made = [], []
    for fix in fixes[:MOST]:
        n, record = _first(engine, fix.key)
        per_call = engine.records[fix.key]
        if made:
            calls, _ = engine.proof.students({k: v for f in made for k, v in f.values(engine).items()}, calls=True)
            again = {m: r for m, c in enumerate(calls or []) for r in c.records if r.key == fix.key}
            if n in again:
                record, per_call = again[n], again
        out.append(_step(engine, fix, n, record, made, per_call))
        made.append(fix)
    return out


def _named(known, code, variable) -> str:
    """How a sentence names the known value beside the student's ``code``: its label with numformer's code, never in
    words the student's code shares ("it uses `dy` where numformer's uses dy")."""
    label = known.label
    if known.kind == "size" or label.startswith("numformer's"):
        return label
    if known.kind == "adjoint":
        return f"{label} ({known.code})"
    if label in (code, variable, known.code):
        return f"numformer's `{known.code}`" if known.code else "numformer's value there"
    return label if not known.code else f"{label} (numformer's `{known.code}`)"


def _bound_elsewhere(engine, n, record, known):
    """(the record binding a returned name on another line, the known value it equals) when that value is one of
    numformer's other than ``known`` (right, in the wrong place); else None."""
    if record.returned is None or len(record.operands) != 1:
        return None
    bound = engine.my_calls[n].records[record.operands[0]]
    if bound.given or bound.variable != record.code or bound.statement == record.statement:
        return None
    other = next((k for k in engine.knowns if k is not known and k.kind == "backward" and n in k.values
                  and _equal(bound.value, k.values[n])), None)
    if other is None or n in other.records and _final_name(engine.ref_calls[n], other.records[n], bound.variable):
        return None  # (numformer binds the same name to it, ``dx``: the value is in its place, the return is wrong)
    return bound, other


def _shares(label, code, variable) -> bool:
    """``label`` has the student's ``code`` or ``variable`` as a word ("the returned dz" beside `dz`): said against
    it ("`dz` where ... the returned dz"), numformer's code names it instead."""
    return any(w and re.search(rf"(?<![\w.]){re.escape(w)}(?![\w(])", label) for w in (code, variable))


def _step(engine, fix, n, record, made=(), per_call=None) -> WrongStep:
    ex, known, per_call = engine.ex, fix.known, per_call or engine.records[fix.key]
    line = record.statement or record.line
    where = f"your line {line} (`{_shown(engine, n, record)}`)"
    what = _named(known, record.code, record.variable)
    code_only = what.startswith("numformer's")  # its label is its code: said after, not before
    head, ref = ("first wrong step: ", what) if code_only else (f"first wrong step: {what}: ", "numformer's")
    ref = "it" if known.kind == "adjoint" else ref
    calls = [m for m in per_call if m in known.values and (known.values[m].any() or per_call[m].value.any())]
    factors = _multiples(per_call, known, engine.wrong_calls) if fix.c is None else None
    factor_name, pattern, note = None, None, "" if made else _operand_note(engine, n, record, known)
    if fix.after is not None:  # the two named by their code where their labels are one ("dP = dO V^T")
        a, b = (f"numformer's `{k.code}`" if fix.after.label == known.label else _named(k, record.code, record.variable)
                for k in (fix.after, known))
        said = (f"first wrong step: a step missing after {where}: yours is {a}, and your code after it needs {b} "
                "there, which numformer's computes from it")
    elif record.kind == "name" and (elsewhere := _bound_elsewhere(engine, n, record, known)) is not None:
        # a right value returned in another's place: the line binding it is the mistake's (``dx = dy.sum(...)``, the
        # table's gradient, where dx = dy belongs), not the return passing it on
        bound, other = elsewhere
        line = bound.statement or bound.line
        said = (f"first wrong step: your line {line} (`{_shown(engine, n, bound)}`) binds `{record.code}` to "
                f"{_named(other, bound.code, bound.variable)}, a value numformer's computes for another place, where "
                f"your code needs {_named(known, record.code, record.variable)}, which it returns")
        note = ""
    elif record.kind == "name":  # a value passed on, returned or bound: what it passes
        what = f"numformer's `{known.code}`" if known.code and _shares(what, record.code, record.variable) else what
        said = (f"first wrong step: {where} returns `{record.code}` where your code needs {what}{note}"
                if record.returned is not None else
                f"first wrong step: {where} binds `{record.code}` where your code needs {what}: {fix.shape}"
                if fix.shape else
                f"first wrong step: {where} passes `{record.code}` where numformer's passes "
                f"{what.removeprefix(OURS) if what.startswith(OURS + '`') else what}{note}")
        note = ""
    elif any(per_call[m].value.ndim >= 2 and per_call[m].value.shape != known.values[m].shape and
             per_call[m].value.shape == swapped_shape(known.values[m].shape) for m in calls):
        m = next(m for m in calls if per_call[m].value.shape != known.values[m].shape)
        said = (f"{head}{where} is {ref} transposed: shape {per_call[m].value.shape} where numformer's is "
                f"{known.values[m].shape}; swap its last two axes")
    elif fix.reduced:
        said = f"{head}{where} is {ref} {fix.reduced}: keep that axis"
    elif fix.shape:
        said = f"{head}{where} computes {'it' if not code_only else ref} over another axis: {fix.shape}"
    elif known.kind == "size":
        wants = ", ".join(f"{float(known.values[m]):.6g}" for m in per_call)
        values = ", ".join(f"{float(per_call[m].value):.6g}" for m in per_call)
        said = f"first wrong step: {where} must be {known.label} ({wants} in the calls of the cases); yours is {values}"
    elif factors is not None:
        factor_name = name_factor(ex, factors, [engine.my_calls[m] for m in calls])
        values = ", ".join(f"{c:.6g}" for c in factors)
        said = (f"{head}{where} is {factor_name or values} times {ref}"
                + (f" ({factor_name} = {values} in the calls of the cases)" if factor_name and len(set(
                    f"{c:.6g}" for c in factors)) > 1 else ""))
    else:
        theirs = known.values[n] * (1.0 if fix.c is None else fix.c.get(engine.my_calls[n].case, 1.0))
        view = _view(record.value, theirs)
        if view is None:
            words = f"it has shape {record.value.shape}, numformer's {theirs.shape}"
        else:
            pattern, words = entry_pattern(ex, engine.my_calls[n].args, view, theirs)
        if fix.c is not None:
            cs = list(dict.fromkeys(fix.c.values()))
            c_name = name_factor(ex, cs, [engine.my_calls[m] for m in calls])
            said = (f"first wrong step: {where}: your code needs {c_name or ', '.join(f'{c:.6g}' for c in cs)} times "
                    f"{what} there; {words}")
        elif known.kind == "adjoint":
            said = f"first wrong step: {where} must be {what}; {words}"
        elif known.kind == "argument" and record.kind == "in place":
            said = (f"first wrong step: {where} changes `{known.code}`, which your code needs as it was given (the "
                    f"argument, with what other uses put in it): {words}")
        elif known.kind == "argument":
            said = f"first wrong step: {where} stands where your code needs the argument `{known.code}`: {words}"
        else:
            said = f"{head}{where} computes {'it' if not code_only else ref} differently: {words}"
    if fix.key in engine.right and (record.kind != "name" or record.returned is not None) and fix.after is None:
        equal = next((k for k in engine.knowns if k.values.get(n) is not None and _equal(record.value, k.values[n])),
                     None)
        note += f"; yours is {_named(equal, record.code, record.variable)}" if equal is not None else ""
    said += note + _fix_words(engine, record)
    return WrongStep(known.label, known.code, known.variable, line, factor_name, pattern, said, note,
                     own=known.kind != "backward")


def _shown(engine, n, record) -> str:
    """The student's code of ``record``; for a name passed on, the call it is passed to."""
    if record.kind != "name":
        return record.code
    if record.variable and record.variable != record.code and record.returned is None:
        return f"{record.variable} = {record.code}"  # a name bound again
    call = engine.my_calls[n]
    user = next((r for r in call.records[record.index + 1:] if record.index in r.operands), None)
    return user.code if user is not None else record.code


def _operand_note(engine, n, record, known) -> str:
    """"; it uses `dy` where numformer's uses dxhat (your `dy * gamma`, line 75)" when the student's expression and
    numformer's differ by one operand, the others alike; for a name passed on, what it passes."""
    call = engine.my_calls[n]
    if record.kind == "name":  # (said in the sentence itself): the student's value that would do, if any
        instead = next((s for s in call.records if not s.given and s.kind != "name" and s.index != record.index
                        and known.values.get(n) is not None and _equal(s.value, known.values[n])), None)
        return f"; your `{instead.variable or instead.code}` (line {instead.statement or instead.line}) holds it" \
            if instead is not None else ""
    theirs = known.records.get(n)
    source = engine.ref_calls if known.kind == "backward" else engine.forward if known.kind == "forward" else None
    if theirs is None or source is None or not theirs.operands or not record.operands \
            or not _alike(theirs.kind, record.kind):
        return ""
    ours = [source[n].records[i] for i in theirs.operands]
    mine = [call.records[i] for i in record.operands]
    odd_mine = [m for m in mine if not any(_equal(m.value, o.value) for o in ours)]
    odd_ours = [o for o in ours if not any(_equal(m.value, o.value) for m in mine)]
    if len(odd_mine) != 1 or len(odd_ours) != 1:
        return ""
    m, o = odd_mine[0], odd_ours[0]
    instead = next((s for s in call.records if not s.given and s.kind != "name" and s.index != record.index
                    and _equal(s.value, o.value)), None)
    label = _label(engine.ex, o)
    if label in (m.code, m.variable) or _shares(label, m.code, m.variable):
        label = f"`{o.code}`" if o.code not in (m.code, m.variable) else "another value"
    yours = f"; your `{instead.variable or instead.code}` (line {instead.statement or instead.line}) holds it" \
        if instead is not None and instead.index != m.index else ""
    used = f"`{m.variable}` (line {m.statement or m.line})" if m.variable and m.variable != m.code else f"`{m.code}`"
    return f"; it uses {used} where numformer's uses {label}{yours}"


_FAMILIES = ({"Mult", "Div"}, {"Add", "Sub"})


def _alike(ours: str, theirs: str) -> bool:
    """Whether the student's expression of kind ``theirs`` computes what numformer's of kind ``ours`` does, so that
    their operands correspond: the same operator (or its inverse), the same array function, or both a call or an
    in-place update (numformer's ``scatter_add`` is a student's ``np.add.at``)."""
    called = lambda k: k.startswith("call") or k == "in place"  # noqa: E731
    return ours == theirs or any(ours in f and theirs in f for f in _FAMILIES) or (called(ours) and called(theirs))


def _fix_words(engine, record) -> str:
    """"; a fix: `x` for `y`" when one edit of the student's line makes every gradient right (a suggestion only:
    grad_checks/own_route.py), else ""."""
    found = suggestion(engine.proof, record.statement or record.line, record.code)
    if found is None:
        return ""
    return f"; a fix: `{found.after}` for `{found.before}`" + (
        f" (Python reads `{found.before}` as `{found.reading}`)" if found.reading else "")


def _together(engine, fix, n, record, unknown) -> WrongStep:
    """The lines that can each absorb the error, named together: the known value's line and those of its inputs that
    no known value fixes."""
    line = record.statement or record.line
    lines = sorted({u.statement or u.line for u in unknown} | {line})
    others = [k for k in lines if k != line]
    where = "lines " + ", ".join(map(str, lines[:-1])) + f" or {lines[-1]}"
    said = (f"the mistake is on {where}, not proven which: with {_named(fix.known, record.code, record.variable)} in "
            f"the place of your `{_shown(engine, n, record)}` (line {line}) every gradient is right, and what it is "
            f"computed from on {'line' if len(others) == 1 else 'lines'} {', '.join(map(str, others))} is no value "
            "known here, so each could hold the mistake, or one compensate the other")
    return WrongStep(fix.known.label, fix.known.code, fix.known.variable, None, None, None, said, proven=False,
                     lines=tuple(lines))


def _float32(calls) -> WrongStep | None:
    """The student's lines whose arrays are float32 (or float16) in the float64 check (in the recorded ``calls``), the
    first of each chain (a cast) that rounds: a low-precision array of whole numbers (a mask ``positive.astype(
    np.float32)``, a float32 buffer of zeros) loses nothing, the line that computes with it in float32 does
    (``np.multiply(dy, gate, dtype=gate.dtype)``); or None."""
    def rounds(r):
        return _low(r) and not (np.all(r.value == np.round(r.value)) and np.all(np.abs(r.value) < 2 ** 24))
    lines = []
    for test in (rounds, _low):  # (every low array whole numbers: the first of each chain, as it is)
        for call in calls:
            for r in call.records:
                if test(r) and not any(test(call.records[o]) for o in r.operands):
                    lines.append((r.statement or r.line, r.code, str(r.dtype)))
        if lines:
            break
    if not lines:
        return None
    lines = list(dict.fromkeys(lines))
    said = "; ".join(f"your line {k} (`{code}`) computes in {dtype}" for k, code, dtype in lines[:3])
    said += (": the check runs in float64 and numformer's backward keeps its inputs' dtype: compute in the dtype you "
             "are given (no astype, no np.float32)")
    return WrongStep("float32", "", None, lines[0][0], None, None, "first wrong step: " + said,
                     lines=tuple(k for k, *_ in lines), own=True)


def _overwritten(engine) -> WrongStep | None:
    """A name bound again over a gradient the code never read (``dx = dy`` then ``dx = self.norm.backward(d)``; a
    second projection's gradient assigned over the first's): the later value is numformer's, and what the code after
    it needs is the sum of the two (every gradient right with it there, in every call). The value that line must
    hold is then known, its inputs are right: the first wrong step is the assignment, which drops the earlier value."""
    for n in engine.wrong_calls:
        records = engine.my_calls[n].records
        # a value read for its shape alone (np.zeros_like(grad)) is not read; an in-place assignment reads the array
        # it writes into only to write into it
        read = {i for r in records if r.kind not in _SHAPE_ONLY for i in r.operands
                if not (r.kind == "in place" and r.variable in (records[i].variable, records[i].given and records[i].code))}
        for r in records:
            whole = r.kind == "in place" and r.code.split("=")[0].strip() in (f"{r.variable}[...]", f"{r.variable}[:]")
            # (a whole array written in place: the buffer given, filled from the gradient in place where the
            # recording keeps no operand, np.add.at's)
            if not r.variable or r.given or not (r.key in engine.right and engine.gradient_side(n, r) or whole):
                continue
            earlier = [p for p in records[:r.index] if p.index not in read and p.value.shape == r.value.shape and (
                p.variable == r.variable and engine.gradient_side(n, p) or p.given and p.code == r.variable)]
            # (or a child's backward whose result is dropped, before or after: ``self.w_v.backward(...)`` alone)
            earlier = earlier or [p for p in records if p.index not in read and p.value.shape == r.value.shape and
                                  p.variable is None and p.returned is None and not p.given and
                                  p.kind.endswith("backward") and p.statement != r.statement and
                                  engine.gradient_side(n, p)]
            if not earlier:
                continue
            p = earlier[-1]
            overrides, sums = {}, {}
            for m, mine in engine.records[r.key].items():
                before = next((q for q in engine.my_calls[m].records if q.key == p.key), None)
                if before is None or before.value.shape != mine.value.shape:
                    break
                overrides[(m, r.key)] = sums[m] = mine.value + before.value
            else:
                if not engine.proof.right(engine.proof.students(overrides)):
                    continue
                known = next((k for k in engine.knowns if all(m in k.values and _equal(v, k.values[m])
                                                              for m, v in sums.items())), None)
                equal = next((k for k in engine.knowns if all(m in k.values and _equal(rec.value, k.values[m])
                                                              for m, rec in engine.records[r.key].items())), None)
                line = r.statement or r.line
                yours = f" ({_named(equal, r.code, r.variable)})" if equal is not None else ""
                needs = f" ({_named(known, r.code, r.variable)})" if known is not None else ""
                drops = not p.given and p.variable is None  # a child's backward whose result is dropped
                replaced = f"the argument `{p.code}`" if p.given else \
                    f"your line {p.statement or p.line} (`{p.code}`), whose result nothing reads" if drops else \
                    f"your `{r.variable}` of line {p.statement or p.line} (`{p.code}`)"
                shown, fix = (r.code, "add into it (`+=`)") if whole else (
                    f"{r.variable} = {r.code}", f"add it (`{r.variable} += ...`, or `{r.variable} = {r.variable} + {r.code}`)")
                if drops and not whole:
                    fix = f"add it (`{r.variable} = {r.code} + {p.code}`)"
                said = (f"first wrong step: your line {line} (`{shown}`) {'writes' if whole else 'binds'} "
                        f"`{r.variable}` {'with' if whole else 'to'} a value{yours}"
                        f"{' and drops another' if drops else ' over one nothing read'}: your code needs the sum of "
                        f"the two there{needs}; the value {'dropped' if drops else 'it replaces'}: {replaced}; {fix}")
                return WrongStep(known.label if known else r.variable, known.code if known else "",
                                 known.variable if known else None, line, None, None, said)
    return None


def _swapped(engine) -> list:
    """Two returned values in each other's place (``return dmem, dy``, whose shapes are then numformer's the other way
    round, in some call): each put where the other is returned, the shapes are numformer's; then every gradient is
    right (the one mistake), or a first wrong step of what remains is a second one (its inputs right with the swap
    made). The second of the two must be a name bound before the return (each replay returns the values as its own
    code computed them: the first's kept aside as it is made). [] when no two returned values swap so."""
    for n in engine.wrong_calls:
        mine = sorted((r for r in engine.my_calls[n].records if r.returned is not None), key=lambda r: r.returned)
        theirs = {r.returned: r for r in engine.ref_calls[n].records if r.returned is not None}
        for i, a in enumerate(mine):
            for b in mine[i + 1:]:
                ta, tb = theirs.get(a.returned), theirs.get(b.returned)
                if ta is None or tb is None or b.kind != "name" or a.value.shape == ta.value.shape or not (
                        a.value.shape == tb.value.shape and b.value.shape == ta.value.shape):
                    continue  # (only where the shapes say so: two of one shape swapped are wrong values, found so)
                first, second = _swap(b.code)  # (one pair for every call: what it keeps is by call number)
                base = {}
                for m in set(engine.records[a.key]) & set(engine.records[b.key]):
                    base[(m, a.key)], base[(m, b.key)] = first, second
                return _swap_steps(engine, a, b, ta, tb, base)
    return []


def _swap_steps(engine, a, b, ta, tb, base) -> list:
    line = a.statement or a.line
    step = WrongStep(f"returned values {a.returned + 1} and {b.returned + 1}", "", None, line, None, None,
                     f"first wrong step: your line {line} returns `{a.code}` where numformer's returns `{ta.code}` and "
                     f"`{b.code}` where numformer's returns `{tb.code}`: two values in each other's place (their "
                     "shapes are numformer's the other way round); swap them")
    if engine.proof.right(engine.proof.students(base)):
        return [step]
    fix = _second(engine, base, [k for k in engine.slice() if k not in (a.key, b.key)],
                  lambda f: not engine.unknown_inputs(*_first(engine, f.key), fixed={a.key, b.key}))
    return [step] + (_said(engine, [fix]) if fix is not None else [])


def _swap(second):
    """Overrides for a returned pair in each other's place: the first returns the value the name ``second`` is
    bound to (keeping its own aside), the second returns the first's."""
    kept = {}

    def first_value(call, value):
        kept[call.number] = value
        index = call.by_name.get(second)
        return None if index is None else call.records[index].value

    def second_value(call, value):
        return kept.pop(call.number, None)
    return first_value, second_value


_SHAPE_ONLY = ("zeros_like", "empty_like", "ones_like", "full_like")  # calls reading an array's shape, not its values


def _bound_indices(engine, keep) -> list:
    """[((name, line), {call: value})] of the integer or boolean arrays the student bound to a name (the recording's
    ``indices``) that ``keep(value)`` takes, in the order of their lines."""
    names = {}
    for n, call in enumerate(engine.my_calls):
        for name, (line, value) in call.indices.items():
            if keep(value):
                names.setdefault((name, line), {})[n] = value
    return sorted(names.items(), key=lambda item: item[0][1] or 0)


def _count(engine) -> WrongStep | None:
    """A count the student bound to a name (``d = xhat.shape[0]``) that is one size the exercise names where the
    rest of their code needs another: with that size there (in every call) every gradient is right, and with no
    other. The value it must hold is then known (a size), its inputs are the arguments: the first wrong step."""
    for (name, line), arrays in _bound_indices(engine, lambda v: v.ndim == 0 and v.dtype.kind in "iu"):
        per_call = {n: int(v) for n, v in arrays.items()}
        values = {n: symbol_values(engine.ex, engine.my_calls[n].args) for n in per_call}
        common = [s for s in next(iter(values.values())) if all(s in v for v in values.values())]
        fitting = []
        for size in common:
            wants = {n: values[n][size] for n in per_call}
            if all(float(w).is_integer() for w in wants.values()) and any(
                    wants[n] != per_call[n] for n in per_call if n in engine.wrong_calls):
                overrides = {(n, ("position", name)): np.array(int(w)) for n, w in wants.items()}
                if engine.proof.right(engine.proof.students(overrides)):
                    fitting.append((size, wants))
        if len({tuple(w.values()) for _, w in fitting}) != 1:
            continue  # none, or several sizes of other values would do: not pinned
        size, wants = fitting[0]
        code = engine.my_calls[next(iter(per_call))].index_code.get(name, name)
        calls = [n for n in per_call if n in engine.wrong_calls] or list(per_call)
        is_ = [s for s in common if all(values[n][s] == per_call[n] for n in per_call)]
        mine = ", ".join(str(per_call[n]) for n in calls) + (f" ({is_[0]})" if is_ else "")
        said = (f"first wrong step: your line {line} (`{name} = {code}`) holds {mine} where your code needs "
                f"{size} ({', '.join(str(int(wants[n])) for n in calls)}) there")
        return WrongStep(size, "", None, line, None, None, said + _fix_words(engine, _Position(code, line)),
                         own=True)
    return None


def _mask(engine) -> WrongStep | None:
    """A boolean mask the student bound to a name (``through = dy > 0``) where the rest of their code needs a mask
    the exercise gives (``positive``): with the argument there, in every call, every gradient is right. The value it
    must hold is then known (an argument), its inputs are arguments: the first wrong step."""
    for (name, line), per_call in _bound_indices(engine, lambda v: v.dtype == bool and v.ndim):
        args = [a for a, v in engine.my_calls[next(iter(per_call))].args.items() if getattr(v, "dtype", None) == bool]
        for arg in args:
            given = {n: np.asarray(engine.my_calls[n].args.get(arg)) for n in per_call}
            if any(g.shape != per_call[n].shape for n, g in given.items()) or not any(
                    not np.array_equal(given[n], per_call[n]) for n in per_call if n in engine.wrong_calls):
                continue
            if engine.proof.right(engine.proof.students({(n, ("position", name)): g for n, g in given.items()})):
                code = engine.my_calls[next(iter(per_call))].index_code.get(name, name)
                said = (f"first wrong step: your line {line} (`{name} = {code}`) holds a mask where your code needs "
                        f"the argument `{arg}` there (with it every gradient is right)")
                return WrongStep(arg, arg, None, line, None, None, said, own=True)
    return None


def _low(record) -> bool:
    """Computed in float32 or float16 (the check's arrays are float64)."""
    return getattr(record.dtype, "kind", "f") == "f" and getattr(record.dtype, "itemsize", 8) < 8


def _outputs(engine) -> list:
    """The wrong returned values, each with where it differs and the student's lines that feed it, when no step
    can be proven wrong (the lines whose values are known right left out)."""
    out, said = [], set()
    for n in engine.wrong_calls:
        call, ref = engine.my_calls[n], engine.ref_calls[n]
        for r in ref.records:
            if r.returned is None or r.returned in said:
                continue
            mine = next((s for s in call.records if s.returned == r.returned), None)
            view = None if mine is None or _right_returned(mine, ref) else _view(mine.value, r.value)
            if view is None:
                continue
            said.add(r.returned)
            pattern, words = entry_pattern(engine.ex, ref.args, view, r.value)
            lines = sorted({call.records[i].statement or call.records[i].line for i in _slice(call, mine.index)
                            if not call.records[i].given and call.records[i].key not in engine.right
                            and call.records[i].line is not None})
            label = engine.ex.outputs[r.returned] if r.returned < len(engine.ex.outputs) else _label(engine.ex, r)
            feed = ""
            if lines:
                feed = (f"; no step of it is proven wrong: the mistake is on {'line' if len(lines) == 1 else 'lines'} "
                        f"{_numbers(lines)}, which feed it (your lines whose values numformer's also computes are "
                        "right)")
            out.append(WrongStep(label, r.code, r.variable, mine.line, None, pattern,
                                 f"the returned {label}: your line {mine.line} (`{mine.code}`): {words}{feed}",
                                 proven=False, lines=tuple(lines)))
    return out


def _slice(call, index) -> set:
    """The indices of the records ``index`` is computed from, at any depth, itself included."""
    return {r.index for r in _upstream(call, [index])}


def _upstream(call, start, through=lambda r: True) -> list:
    """The records the indices ``start`` name and those they are computed from, at any depth, each once; the walk
    goes past a record only where ``through(record)``."""
    out, seen, todo = [], set(), list(start)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            out.append(call.records[i])
            todo += list(call.records[i].operands) if through(call.records[i]) else []
    return out


def _numbers(lines) -> str:
    said = [str(k) for k in lines]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + f" or {said[-1]}"
