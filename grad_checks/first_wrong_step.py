"""The first step a student's backward gets wrong: numformer's intermediates compared with the student's, one by one.

Karpathy's "backprop ninja" has the student compare every intermediate gradient (dlogprobs, dprobs, ...)
with autograd's by hand. Here the grading does it for any exercise: numformer's reference and the
student's code run on the same cases with every array they compute recorded (grad_checks/recorded_run.py),
and each intermediate of the reference is looked for among the student's, by value, up to a transpose,
a reshape or a scalar factor:

* **right**: the student computes an array equal to it (to 1e-9 of its largest entry);
* **scaled**: the student computes ``c`` times it (``c`` not 1) and nothing equal to it;
* **missing**: neither.

The intermediates form numformer's data flow (each knows the ones it is computed from). A *first wrong
step* is an intermediate on the way to a wrong returned gradient that is not right although everything it is
computed from is: the student's mistake is there, not upstream and not merely carried downstream. Each is
said under its math name (the exercise's ``names``, else the name numformer's code binds it to, else its
code), with the line of the student's file that computed the nearest wrong counterpart (an array of its
shape, computed from the same right operands) and what differs: a factor named by what it equals in every
case (``d``, ``sqrt(d_k)``, the token count: the exercise's ``symbols`` and the scalar arguments), the
entries in the exercise's own terms (the masked positions, padding, repeated ids: its ``entry_sets``; one
row, column or head), or how many entries. The matching and the counterpart live in grad_checks/counterparts.py, the naming of a factor in
grad_checks/factor_names.py, the entries' words in grad_checks/entry_patterns.py.
Two independent mistakes give two first steps, both named: once a first step is found, numformer's
reference is replayed with the student's value at that step (:class:`~grad_checks.recorded_run.Recorder`'s
overrides), and the next intermediate that still differs is the next mistake, not a consequence of the first.

No blame without proof (issue 61): the data flow only points at steps; one is said only when a replay proves it
(:func:`_prove`): numformer's backward given the student's values at the steps computes the student's gradients,
every one, each step needed; or the student's code given numformer's value at the student's line (the operand it
used in numformer's place first: the line recomputing a sigmoid, not the line using it) gets right whatever the
change touches. Else the student's lines are searched for one whose value, swapped both ways with one of
numformer's, proves it (:func:`_search`); else for a line of the student's own route one edit of which makes every
gradient right, no edit of another line doing so (grad_checks/own_route.py; its lines' values numformer's code, backward
or forward, does not compute: ``WrongStep.own``); else no step is named, and the wrong returned values are said with
the student's lines that feed them (``WrongStep.proven`` False, ``lines``): a route of the student's own is never told
that a step it does not take is wrong. The replays of one answer stop after :data:`SEARCH_BUDGET` seconds, and the
diagnosis then says so, with the wrong returned values and the lines feeding them.

The student's run and numformer's are recorded once (:class:`Recordings`) for this and grad_checks/raised_line.py;
each function is rewritten for recording once, and every replay reuses it.
"""
from __future__ import annotations

import inspect
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from numformer.swap import using
from numformer.user_code_clock import StudentCodeTimeout

from .candidates import APPROX, floor, relative_errors, run_class
from .counterparts import _returned_as, _student_map, compare_call, computed, counterpart, same, views
from .entry_patterns import entry_pattern
from .factor_names import name_factor
from .own_route import repair
from .recorded_run import Recorder, recorded

MOST = 3        # first wrong steps said at most

# Seconds of replays (numformer's backward and the student's code run again, with a value or a line changed) one
# wrong answer's diagnosis may take before it stops and says what it has: the wrong entries and the lines feeding
# them, never a guess. Measured on the project's sets (the 38 of tests/exercises/student_mistakes*.py and the 8 of
# tests/exercises/test_no_blame_without_proof.py, on the 2-core Zen 3 with other jobs running): the median diagnosis
# took 0.07-0.09 s, the slowest 0.6-0.9 s (LayerNorm through the variance: 48 replays of the swap search, then
# about 70 edits of its own route). 3 s leaves the slowest a margin of 3x on a loaded machine (a CI run's two
# workers), and a student waits a few seconds for a slow backward's proof, not the clock's 10 s a case.
SEARCH_BUDGET = 3.0


@dataclass
class WrongStep:
    """A first wrong step: numformer's intermediate (``name``, its ``code`` and ``variable``), the student's line
    computing the nearest wrong counterpart (None: never computed), the factor or entry pattern, the sentence."""

    name: str
    code: str
    variable: str | None
    line: int | None
    factor: str | None
    pattern: str | None
    said: str
    note: str = ""      # the operand the student used in place of numformer's, when that is the difference
    proven: bool = True     # False: no step proven; the wrong returned value and the student's lines feeding it
    lines: tuple = ()       # those lines (an unproven sentence), in the student's file
    own: bool = False       # a line of the student's own route, proven by an edit of it (grad_checks/own_route.py)


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
            fn = recorded(answer, recorder)
            classes = (ex.layer_class(fn, guard=answer is not ex.target), ex.layer_class(fn, guard=False)) if fn \
                else (None, None)
        per_exercise[ex.name] = (recorder, *classes)
    recorder, guarded, unguarded = per_exercise[ex.name]
    recorder.calls, recorder.overrides = [], overrides or {}
    return recorder, guarded if guard else unguarded


class Recordings:
    """The student's run and numformer's, each recorded once (:func:`recorded_run`) for every part of a diagnosis
    that reads them: :func:`first_wrong_steps` and grad_checks/raised_line.py."""

    def __init__(self, ex, answer, seed: int = 0, file=None, time_limit=None):
        self.ex, self.answer, self.seed, self.file, self.time_limit = ex, answer, seed, file, time_limit

    @cached_property
    def student(self) -> tuple:
        return recorded_run(self.ex, self.answer, self.seed, self.file, self.time_limit)

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
                      self.seed)
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


def recorded_calls(ex, answer, seed: int = 0, file=None, time_limit=None, overrides=None):
    """The :class:`~grad_checks.recorded_run.Call` of every run of ``answer`` on the exercise's cases (with
    ``overrides``, see Recorder), or None when its code cannot be recorded."""
    return recorded_run(ex, answer, seed, file, time_limit, overrides)[0]


def recorded_run(ex, answer, seed: int = 0, file=None, time_limit=None, overrides=None, guard: bool = True) -> tuple:
    """(calls, outcomes): :func:`recorded_calls` and the gradients every case graded (parameters' included), or
    (None, None). ``guard`` False: a replay's (see :func:`_recorded_class`)."""
    recorder, cls = _recorded_class(ex, answer, overrides, guard)
    if cls is None:
        return None, None
    _, outcomes = run_class(ex, cls, seed, file, time_limit)
    if answer is ex.target and any(o.error is not None for o in outcomes):
        return None, None  # numformer's own code failed when recorded: say nothing rather than something wrong
    return recorder.calls, outcomes


# -- the data flow over every call --------------------------------------------------------------------------

@dataclass
class _Step:
    key: tuple
    record: object                  # the reference's record, in the first call it occurs in
    operands: set
    status: dict                    # call number -> status (see compare_call)
    records: dict                   # call number -> the reference's record in that call


def _flow(ref_calls, my_calls) -> dict:
    """{key: _Step} over the calls the student's code returned from (a call that raised has no values past the
    error: its missing steps would be the error's consequence, which the error line already says)."""
    steps = {}
    for n, (ref, mine) in enumerate(zip(ref_calls, my_calls)):
        if not mine.returned:
            continue
        status = compare_call(ref, mine)
        for r in ref.records:
            step = steps.setdefault(r.key, _Step(r.key, r, set(), {}, {}))
            step.operands |= {ref.records[i].key for i in r.operands}
            step.status[n] = status[r.index]
            step.records[n] = r
    return steps


def _right(steps, key) -> bool:
    return key not in steps or all(s[0] == "right" for s in steps[key].status.values())


def _wrong_outputs(steps) -> list:
    return [s for k, s in steps.items() if s.record.returned is not None and not _right(steps, k)]


def _closure(start, operands) -> set:
    """``start`` and everything it is computed from, at any depth (``operands(x)``: what ``x`` is computed from)."""
    found, todo = set(), list(start)
    while todo:
        x = todo.pop()
        if x not in found:
            found.add(x)
            todo += operands(x)
    return found


def _ancestors(steps, keys) -> set:
    return _closure(keys, lambda k: [o for o in steps[k].operands if o in steps])


_VIEWS = ("swapaxes", "T", "transpose", "reshape")  # a view of an array: right when what it views is


def _first_steps(steps: dict) -> list:
    """The steps on the way to a wrong returned value that are wrong although all their operands are reached.

    Reached: right, or computed by another route. A step the student computes only up to a factor is another
    route when a returned value that depends on it is right (``dQ = (dS K) * scale``, the scale put after the
    product: dS itself is never scaled, yet dQ is right): that factor is compensated, not a mistake; a view of a
    reached array (its transpose) is reached too."""
    right_outputs = [k for k, s in steps.items() if s.record.returned is not None and _right(steps, k)]
    routed = {k for k in _ancestors(steps, right_outputs)
              if all(st[0] in ("right", "scaled") for st in steps[k].status.values())}
    reached = {k for k in steps if _right(steps, k)} | routed
    for k in sorted(steps, key=lambda k: steps[k].record.index):  # in the order computed: a view after its array
        if steps[k].record.kind in _VIEWS and steps[k].operands and steps[k].operands <= reached:
            reached.add(k)
    ancestors = _ancestors(steps, [s.key for s in _wrong_outputs(steps)])
    first = [steps[k] for k in ancestors if k not in reached and all(o in reached or o not in steps
                                                                    for o in steps[k].operands)]
    return sorted(first, key=lambda s: (min(s.status), s.record.index))


def _label(ex, record) -> str:
    if record.code in ex.names:
        return ex.names[record.code]
    if record.variable and record.variable in ex.names:
        return ex.names[record.variable]
    if record.returned is not None and record.returned < len(ex.outputs):
        return f"the returned {ex.outputs[record.returned]}"
    return record.variable or record.code



# -- the diagnosis ----------------------------------------------------------------------------------------------

def first_wrong_steps(ex, answer, seed: int = 0, file=None, time_limit=None, recordings=None,
                      budget: float = None) -> list:
    """The :class:`WrongStep` s of ``answer`` (a function or a layer class), in numformer's data-flow order, at
    most :data:`MOST`; [] when its code or numformer's cannot be recorded, or the calls do not line up.
    ``recordings``: the two runs already recorded (:class:`Recordings`); ``budget``: the replays' seconds
    (:data:`SEARCH_BUDGET` when None).

    No blame without proof (issue 61): a step found is said only when a replay proves it (:func:`_prove`); when
    none is, the student's lines are searched for one whose value, replaced by one of numformer's, makes every
    gradient right (:func:`_search`), then for one whose edit does (a route of the student's own:
    grad_checks/own_route.py); else the wrong returned values are said with the student's lines that feed them
    (``proven`` False), and no step is named. Past the budget the search stops and says that, with those."""
    recordings = recordings or Recordings(ex, answer, seed, file, time_limit)
    my_calls, mine = recordings.student
    if not my_calls:
        return []
    ref_calls, reference = recordings.reference
    if not ref_calls or len(ref_calls) != len(my_calls):
        return []
    proof = _Proof(ex, answer, seed, file, time_limit, my_calls, mine, reference,
                   SEARCH_BUDGET if budget is None else budget, recordings)
    flow = _flow(ref_calls, my_calls)
    try:
        return _diagnosis(proof, ref_calls, flow)
    except _Stopped:
        stopped = (f"; the search for the step stopped at its budget ({proof.budget:.3g} s of replays): this is "
                   "what it had")
        return [replace(s, said=s.said + stopped) for s in _outputs(ex, flow, ref_calls, my_calls, set())][:MOST]


def _diagnosis(proof, ref_calls, flow) -> list:
    """:func:`first_wrong_steps` within the budget (each replay raises _Stopped past it)."""
    ex, my_calls = proof.ex, proof.my_calls
    found = _tentative(proof)
    out = _prove(proof, found)
    if not out:
        searched = _search(proof, ref_calls, flow, [f.said.line for f in found if f.said.line is not None])
        if searched is not None:
            return [searched]  # every gradient right with numformer's value there: nothing else to say
        own = _own_route(proof, ref_calls, flow)
        if own is not None:
            return [own]
    if len(out) < len([f for f in found if not f.repeated]) or not out:
        # a step left unproven: the wrong returned values no proven step accounts for, with the lines feeding them
        named = {s.code for s in out}
        out += [s for s in _outputs(ex, flow, ref_calls, my_calls, set()) if s.code not in named]
    return out[:MOST]


@dataclass
class _Found:
    """A step the data flow points at, before any proof: what is said, numformer's value replaced by the student's
    (None: never computed), the student's operand used in place of numformer's (and numformer's), the calls."""

    said: WrongStep
    replacements: dict | None
    operand: tuple | None
    ref_calls: list
    step_key: tuple = ()
    repeated: bool = False
    returned: bool = False  # the step is a returned value: numformer's given the student's returns the student's  # the same wrong operand as a step before: one mistake, said once


def _tentative(proof) -> list:
    """[_Found]: the first wrong steps as numformer's data flow finds them, each replayed into numformer's backward to
    find the next (two independent mistakes: two steps), nothing proven yet."""
    ex, my_calls = proof.ex, proof.my_calls
    overrides, out, said_keys = {}, [], set()
    for _ in range(MOST + 1):
        ref_calls = proof.numformer_calls(overrides)
        if not ref_calls or len(ref_calls) != len(my_calls):
            return out
        steps = _flow(ref_calls, my_calls)
        firsts = [s for s in _first_steps(steps) if s.key not in said_keys]
        if not firsts:
            break
        step = firsts[0]

        def verify(n, value, step=step, base=dict(overrides)):
            """The step's consumers right in call n once numformer's is replayed with ``value`` there."""
            calls = proof.numformer_calls({**base, (n, step.key): value})
            if not calls or len(calls) != len(my_calls):
                return False
            status = compare_call(calls[n], my_calls[n])
            after = [r for r in calls[n].records if step.key in {calls[n].records[o].key for o in r.operands}]
            return bool(after) and all(status[r.index][0] == "right" for r in after)

        said, replacements = _say(ex, step, ref_calls, my_calls, verify)
        repeated = bool(said.note) and said.note in {f.said.note for f in out}
        out.append(_Found(said, replacements, _operand(step, ref_calls, my_calls, said), ref_calls, step.key,
                          repeated, _returned_as(ref_calls[min(step.records)], step.record) is not None))
        said_keys.add(step.key)
        if replacements is None:  # never computed: nothing to replay numformer's with
            break
        overrides.update({(n, step.key): v for n, v in replacements.items()})
    return out


def _operand(step, ref_calls, my_calls, said):
    """(the student's record used in place of numformer's operand, numformer's record) when the counterpart
    differs from numformer's step by one operand the student computed (not an argument), else None."""
    if not said.note or said.line is None:
        return None
    n = min(k for k, s in step.status.items() if s[0] != "right")
    mine = next((s for s in my_calls[n].records if s.line == said.line and s.code in said.said), None)
    if mine is None:
        return None
    mapped = _student_map(ref_calls[n], my_calls[n])
    wanted = set(step.records[n].operands)
    replaced = [o for o in mine.operands if not (mapped[o] & wanted)]
    lacking = wanted - set().union(*[mapped[o] for o in mine.operands]) if mine.operands else wanted
    if len(replaced) != 1 or len(lacking) != 1:
        return None
    theirs, ours = my_calls[n].records[replaced[0]], ref_calls[n].records[next(iter(lacking))]
    return None if theirs.given else (theirs, ours)


# -- the proof: a replay that changes the gradients the way the student's code does ------------------------------

@dataclass
class _Proof:
    ex: object
    answer: object
    seed: int
    file: object
    time_limit: object
    my_calls: list
    mine: list          # the student's outcomes (every graded gradient, per case)
    reference: list     # numformer's
    budget: float       # seconds of replays (SEARCH_BUDGET)
    recordings: object = None   # the Recordings (numformer's forward, read by a route of the student's own)

    def __post_init__(self):
        self.until = time.monotonic() + self.budget

    def _replay(self, run, student: bool, stopped=None):
        """``run(limit)`` quietly (a replayed value may overflow: no proof, no noise), within the budget: _Stopped
        past it. The student's code runs under the clock's limit cut to what is left of the budget; stopped by the
        clock with budget left (an edit that loops), ``stopped`` comes back, or _Stopped when that is None."""
        left = self.until - time.monotonic()
        if left <= 0:
            raise _Stopped
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                return run(min(self.time_limit or left, left) if student else None)
            except StudentCodeTimeout:
                if stopped is None or time.monotonic() >= self.until:
                    raise _Stopped from None
                return stopped

    def numformer_calls(self, overrides):
        return self._replay(lambda _: recorded_calls(self.ex, self.ex.target, self.seed, overrides=overrides), False)

    def numformers(self, overrides):
        return self._replay(lambda _: recorded_run(self.ex, self.ex.target, self.seed, overrides=overrides)[1], False)

    def students(self, overrides):
        return self._replay(lambda limit: recorded_run(self.ex, self.answer, self.seed, self.file, limit,
                                                        overrides, guard=False)[1], True)

    def run(self, fn, cases):
        """The outcomes of the student's code edited (``fn``) on ``cases`` (from 0; None: every case), None in the
        place of a case not run."""
        cls = self.ex.layer_class(fn, guard=False)  # a wrong shape is an error as good as the guard's here
        return self._replay(lambda limit: run_class(self.ex, cls, self.seed, self.file, limit, order=cases)[1], True,
                            stopped=[None] * len(self.reference))

    def right(self, fn, cases) -> bool:
        """Every gradient of ``fn`` (the student's code edited) right on ``cases`` (None: every case)."""
        outcomes = self.run(fn, cases)
        for k, (new, ref) in enumerate(zip(outcomes, self.reference)):
            if cases is not None and k not in cases:
                continue
            if new is None or new.grads is None or ref.grads is None:
                return False
            tiny = floor(ref.grads)
            if any(name not in new.grads or np.shape(new.grads[name]) != np.shape(g)
                   or not _agree(new.grads[name], g, tiny).all() for name, g in ref.grads.items()):
                return False
        return True


class _Stopped(Exception):
    """The diagnosis' budget is spent: no replay starts."""


def _entries(a, b, reference):
    """Per case and tensor, where ``a`` and ``b`` agree (to the grading's tolerance): [(agree(a, b), ...)] over the
    cases all three ran, or None when a tensor is missing."""
    if a is None or b is None or len(a) != len(reference) or len(b) != len(reference):
        return None
    out = []
    for x, y, r in zip(a, b, reference):
        if x is None or y is None or x.grads is None or y.grads is None or r.grads is None:
            continue
        tiny = floor(r.grads)
        for name, g in r.grads.items():
            if name not in x.grads or name not in y.grads or np.shape(x.grads[name]) != np.shape(g) \
                    or np.shape(y.grads[name]) != np.shape(g):
                return None
            out.append((name, x.grads[name], y.grads[name], g, tiny))
    return out


def _agree(a, b, tiny):
    return relative_errors(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), tiny) <= APPROX


def _explains(replayed, proof) -> bool:
    """numformer's backward replayed with the student's values computes the student's gradients, every one of them
    (parameters' included: a child's backward given a wrong gradient accumulates wrong ones), and is not
    numformer's somewhere."""
    pairs = _entries(replayed, proof.mine, proof.reference)
    if pairs is None:
        return False
    moved = False
    for _, new, mine, ref, tiny in pairs:
        moved |= not _agree(new, ref, tiny).all()
        if not _agree(new, mine, tiny).all():
            return False
    return moved


def _within(replayed, proof) -> bool:
    """The replay is not numformer's somewhere, and only where the student's is not numformer's either."""
    pairs = _entries(replayed, proof.mine, proof.reference)
    if pairs is None:
        return False
    moved = False
    for _, new, mine, ref, tiny in pairs:
        off = ~_agree(new, ref, tiny)
        moved |= bool(off.any())
        if (off & _agree(mine, ref, tiny)).any():
            return False
    return moved


def _fixes(replayed, proof, whole: bool = False) -> bool:
    """The student's code replayed with numformer's value at one line: every gradient the change touches is
    right (``whole``: every gradient), and it touches one."""
    pairs = _entries(replayed, proof.mine, proof.reference)
    if pairs is None:
        return False
    moved = False
    for _, new, mine, ref, tiny in pairs:
        right = _agree(new, ref, tiny)
        changed = ~_agree(new, mine, tiny)
        moved |= bool(changed.any())
        if (changed & ~right).any() or (whole and not right.all()):
            return False
    return moved


def _union(found) -> dict:
    out = {}
    for f in found:
        out.update({(n, f.step_key): v for n, v in f.replacements.items()})
    return out


def _prove(proof, found) -> list:
    """The steps of ``found`` a replay proves, said; the first unproven one ends the list (what follows it was
    found with its value in place)."""
    replayable = [f for f in found if f.replacements is not None]
    proven_a = set()
    for k in range(len(replayable), 0, -1):  # the longest run of steps whose values, together, explain the student's
        chosen = replayable[:k]
        if not _explains(proof.numformers(_union(chosen)), proof):
            continue
        for j, f in enumerate(chosen):  # each one needed: without it, the others do not explain the student's
            # a returned value found after it masks it (given the student's returned value, numformer's code
            # returns the student's whatever came before): then it must, alone with those before it, make wrong
            # only entries the student's has wrong
            masking = [g for g in chosen[j + 1:] if g.returned]
            rest = [g for g in chosen if g is not f and g not in masking]
            if rest and _explains(proof.numformers(_union(rest)), proof):
                continue
            if masking and not _within(proof.numformers(_union(chosen[:j + 1])), proof):
                continue
            proven_a.add(id(f))
        break
    out = []
    for f in found:
        if f.repeated:
            continue
        said = _fixed_at_operand(proof, f)  # upstream of the step: the operand the student computed wrongly
        if said is None and id(f) in proven_a:
            said = f.said
        if said is None and f.replacements is not None and not _returned_line(proof, f.said.line) \
                and _fixes(proof.students(_student_overrides(proof, f.ref_calls, f.said)), proof):
            said = f.said  # numformer's value at the student's line puts right what it touches
        if said is None:
            break
        out.append(said)
    return out


def _returned_line(proof, line) -> bool:
    return any(r.returned is not None and r.line == line for c in proof.my_calls for r in c.records)


def _student_overrides(proof, ref_calls, said, record=None, ref_record=None) -> dict:
    """{(call, the student's record's key): numformer's value} for every call holding both: the student's line
    ``said.line`` (or ``record``) given numformer's value of the step (or ``ref_record``)."""
    out = {}
    for n, (mc, rc) in enumerate(zip(proof.my_calls, ref_calls)):
        if record is not None:
            s = next((r for r in mc.records if r.key == record.key), None)
            r = next((x for x in rc.records if x.key == ref_record.key), None)
        else:
            s = next((r for r in mc.records if r.line == said.line and r.code in said.said and not r.given), None)
            r = next((x for x in rc.records if x.code == said.code and not x.given), None)
        if s is None or r is None:
            continue
        v = next(iter(views(r.value, s.value.shape)), None)
        if v is not None:
            out[(n, s.key)] = v
    return out


def _fixed_at_operand(proof, f):
    """The step said at the student's operand when numformer's value there puts right what it touches."""
    if f.operand is None:
        return None
    theirs, ours = f.operand
    if not _fixes(proof.students(_student_overrides(proof, f.ref_calls, f.said, theirs, ours)), proof):
        return None
    label = _label(proof.ex, ours)
    where = "" if label == ours.code else f" (numformer's `{ours.code}`)"
    said = (f"first wrong step: your line {theirs.line} (`{theirs.code}`), used where numformer's uses {label}{where}: "
            "with numformer's value in its place, what it feeds is right")
    return WrongStep(label, ours.code, ours.variable, theirs.line, None, None, said, f.said.note)


SEARCHED = 48   # replays of the student's code at most, looking for the line whose value is the mistake


def _search(proof, ref_calls, steps, unproven_lines=()):
    """A line of the student's own route whose value, replaced by one of numformer's, makes every gradient right,
    and whose value put in numformer's code gives the student's gradients (a sigmoid recomputed with its sign lost:
    numformer's s there, and all is right); the earliest, or None. Not a line computed from one where the data
    flow found a step it could not prove (``unproven_lines``): the mistake may be there, where no value of
    numformer's fits (another shape), and a line after it would only compensate; not numformer's returned values
    (given those, any code returns the right thing)."""
    if steps is None:
        return None
    wrong = [s for s in _wrong_outputs(steps)]
    n = next((k for s in wrong for k, st in sorted(s.status.items()) if st[0] != "right"), None)
    if n is None:
        return None
    mc, rc = proof.my_calls[n], ref_calls[n]
    feeding = _slice(mc, [computed(mc, r).index for r in mc.records if r.returned is not None])
    after = set()
    for s in mc.records:  # the records computed from one on an unproven step's line
        if s.line in unproven_lines or any(o in after for o in s.operands):
            after.add(s.index)
    tried = 0
    for s in mc.records:
        if s.index not in feeding or s.given or s.returned is not None or s.kind == "name" or s.index in after:
            continue
        for r in rc.records:
            if _returned_as(rc, r) is not None:
                continue
            view = next(iter(views(r.value, s.value.shape)), None)
            if view is None or r.value.shape != view.shape and r.value.size != s.value.size:
                continue
            if tried >= SEARCHED:
                return None
            tried += 1
            over = _student_overrides(proof, ref_calls, None, s, r)
            if not over or not _fixes(proof.students(over), proof, whole=True):
                continue
            # and the other way round: numformer's code given the student's value there computes the student's
            # gradients (a right line of another route that merely compensates a later mistake does not)
            if _explains(proof.numformers(_numformer_overrides(proof, ref_calls, s, r)), proof):
                label = _label(proof.ex, r)
                where = "" if label == r.code else f" (numformer's `{r.code}`)"
                said = (f"first wrong step: your line {s.line} (`{s.code}`) computes what numformer's code has as "
                        f"{label}{where} differently: with numformer's value in its place, every gradient is right")
                return WrongStep(label, r.code, r.variable, s.line, None, None, said)
    return None


def _numformer_overrides(proof, ref_calls, record, ref_record) -> dict:
    """{(call, numformer's record's key): the student's value of ``record``} for every call holding both."""
    out = {}
    for n, (mc, rc) in enumerate(zip(proof.my_calls, ref_calls)):
        s = next((x for x in mc.records if x.key == record.key), None)
        r = next((x for x in rc.records if x.key == ref_record.key), None)
        v = next(iter(views(s.value, r.value.shape)), None) if s is not None and r is not None else None
        if v is not None:
            out[(n, r.key)] = v
    return out


def _slice(call, indices) -> set:
    """The records the given ones are computed from, at any depth, themselves included."""
    return _closure(indices, lambda i: list(call.records[i].operands))


def _replay(step, my_calls, mine) -> dict:
    """{call number: the student's value of the same expression as ``mine``, as numformer's step's shape}, for
    every call holding both: numformer's reference is replayed with it, in every case alike (a case where the
    two agree by chance, y = 1 in a row of one entry, must not make the next step look wrong)."""
    out = {}
    for n, r in step.records.items():
        theirs = next((s for s in my_calls[n].records if s.key == mine.key), None) if n < len(my_calls) else None
        view = next(iter(views(theirs.value, r.value.shape)), None) if theirs is not None else None
        if view is not None:
            out[n] = view
    return out


def _say(ex, step, ref_calls, my_calls, verify=None) -> tuple:
    """(WrongStep, {call number: the student's value to replay numformer's with} or None). ``verify(n, value)``:
    whether numformer's code, replayed with ``value`` at the step in call ``n``, carries on as the student's."""
    rec = step.record
    label = _label(ex, rec)
    where = "" if label == rec.code else f" (numformer's `{rec.code}`)"
    wrong = sorted(n for n, s in step.status.items() if s[0] != "right")
    if all(step.status[n][0] == "scaled" for n in wrong):
        # a call where numformer's is all zeros fits any factor (a row of one entry): it names nothing
        calls = [k for k in sorted(step.status) if step.status[k][0] == "scaled" or step.records[k].value.any()]
        factors = [step.status[k][1] if step.status[k][0] == "scaled" else 1.0 for k in calls]
        named = name_factor(ex, factors, [ref_calls[k] for k in calls])
        mine = my_calls[wrong[0]].records[step.status[wrong[0]][2]]
        values = ", ".join(f"{c:.6g}" for c in factors)
        what = f"{named} times numformer's" if named else f"numformer's times {values} in the calls of the cases"
        said = (f"first wrong step: {label}{where}: your line {mine.line} (`{mine.code}`) is {what}"
                + (f" ({named} = {values} in the calls of the cases)" if named and len(set(factors)) > 1 else ""))
        return WrongStep(label, rec.code, rec.variable, mine.line, named, None, said), _replay(step, my_calls, mine)
    n = wrong[0]
    mine, view, note = counterpart(step.records[n], ref_calls[n], my_calls[n], verify and (lambda v: verify(n, v)))
    if mine is None:
        said = f"first wrong step: {label}{where}: your code never computes it from the right operands"
        return WrongStep(label, rec.code, rec.variable, None, None, None, said), None
    if view is None:
        pattern, words = None, f"it has shape {mine.value.shape}, numformer's {step.records[n].value.shape}"
    else:
        pattern, words = entry_pattern(ex, ref_calls[n].args, view, step.records[n].value)
    said = f"first wrong step: {label}{where}: your line {mine.line} (`{mine.code}`) computes it differently: " \
           f"{words}{note}"
    return WrongStep(label, rec.code, rec.variable, mine.line, None, pattern, said, note), _replay(step, my_calls, mine)


def _wrong_returned(ex, steps, ref_calls, my_calls) -> list:
    """(step, call number, numformer's record, the student's returned record, its view as numformer's shape, the
    student's lines feeding it whose values numformer's code never computes) for each wrong returned value."""
    out = []
    for step in _wrong_outputs(steps):
        n = min(k for k, s in step.status.items() if s[0] != "right")
        r = step.records[n]
        mine = next((s for s in my_calls[n].records if s.returned == r.returned), None)
        view = next(iter(views(mine.value, r.value.shape)), None) if mine is not None else None
        if view is None:
            continue
        mapped = _student_map(ref_calls[n], my_calls[n])
        call = my_calls[n]
        lines = sorted({call.records[i].line for i in _slice(call, [computed(call, mine).index])
                        if not call.records[i].given and not mapped[i] and call.records[i].line is not None})
        out.append((step, n, r, mine, view, lines))
    return out


def _outputs(ex, steps, ref_calls, my_calls, said_keys) -> list:
    """The wrong returned values, each with where it differs and the student's lines that feed it, when no step
    can be proven wrong: what the student returns is still worth a pattern (padding rows that got gradient), and the
    mistake is on one of those lines (a slice of the student's data flow: the lines whose values numformer's code
    also computes are right, and left out)."""
    out = []
    for step, n, r, mine, view, lines in _wrong_returned(ex, steps, ref_calls, my_calls):
        if step.key in said_keys:
            continue
        pattern, words = entry_pattern(ex, ref_calls[n].args, view, r.value)
        label = ex.outputs[r.returned] if r.returned < len(ex.outputs) else _label(ex, r)
        feed = ""
        if lines:
            feed = (f"; no step of it is proven wrong: the mistake is on {'line' if len(lines) == 1 else 'lines'} "
                    f"{_numbers(lines)}, which feed it (your lines whose values numformer's also computes are right)")
        out.append(WrongStep(label, r.code, r.variable, mine.line, None, pattern,
                             f"the returned {label}: your line {mine.line} (`{mine.code}`): {words}{feed}",
                             proven=False, lines=tuple(lines)))
    return out


def _computes_right(call, line, pool) -> bool:
    """The last array ``line`` computes in ``call`` (the statement's value) equals one of ``pool``, up to a view."""
    mine = [r for r in call.records if r.line == line and not r.given]
    return bool(mine) and any(same(v, value) for value in pool for v in views(mine[-1].value, value.shape))


def _own_route(proof, ref_calls, steps):
    """The line of the student's own route whose one edit makes every gradient right (grad_checks/own_route.py), as
    a WrongStep, or None: the lines tried are those feeding a wrong returned value whose values numformer's code
    never computes, in the order the student's code computes them."""
    wrong = _wrong_returned(proof.ex, steps, ref_calls, proof.my_calls)
    lines = sorted({line for *_, feeding in wrong for line in feeding})
    cases = sorted({k for step, *_ in wrong for k, st in step.status.items() if st[0] != "right"})
    forward = proof.recordings.forward if proof.recordings is not None else []
    n = cases[0] if cases else 0
    pool = [r.value for r in ref_calls[n].records] + \
        ([r.value for r in forward[n].records] if len(forward) == len(ref_calls) else [])
    # a line whose value is one numformer's backward or forward computes (x - mu, var + eps) is right: an edit there
    # could only compensate a mistake elsewhere (xmu = xhat for xhat / r puts the variance route's wrong power right)
    lines = [line for line in lines if not _computes_right(proof.my_calls[n], line, pool)]
    fixed = repair(proof, lines, cases)
    if fixed is None:
        return None
    name = fixed.variable or fixed.statement
    said = (f"first wrong step: your line {fixed.line} (`{fixed.statement}`), a step of your own route: with "
            f"`{fixed.after}` for `{fixed.before}` there, every gradient is right, and no single edit of another line "
            "of your route does that" + (f"; {fixed.differs}" if fixed.differs else ""))
    return WrongStep(name, fixed.statement, fixed.variable, fixed.line, None, None, said, own=True)


def _numbers(lines) -> str:
    said = [str(k) for k in lines]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + f" or {said[-1]}"
