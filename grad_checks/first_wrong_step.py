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
row, column or head), or how many entries. Two independent mistakes give two first steps, both named: once a first step is found, numformer's
reference is replayed with the student's value at that step (:class:`~grad_checks.recorded_run.Recorder`'s
overrides), and the next intermediate that still differs is the next mistake, not a consequence of the first.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .candidates import relative_errors, run_class
from .recorded_run import Recorder, recorded

SAME = 1e-9     # an intermediate equals numformer's: within this fraction of its largest entry
WRONG = 1e-6    # an entry differs (relative, as the grading's tolerance)
MOST = 3        # first wrong steps said at most


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


# -- running both, recorded -------------------------------------------------------------------------------

def _recorded_class(ex, answer, recorder):
    """The layer class running ``answer`` recorded into ``recorder``, or None when its code cannot be rewritten."""
    if isinstance(answer, type):  # a whole class: its own method, recorded, in a subclass of it
        fn = recorded(vars(answer).get(ex.target.__name__), recorder)
        return type(answer.__name__, (answer,), {ex.target.__name__: fn}) if fn else None
    fn = recorded(answer, recorder)
    return ex.layer_class(fn, guard=answer is not ex.target) if fn else None


def recorded_calls(ex, answer, seed: int = 0, file=None, time_limit=None, overrides=None):
    """The :class:`~grad_checks.recorded_run.Call` of every run of ``answer`` on the exercise's cases (with
    ``overrides``, see Recorder), or None when its code cannot be recorded."""
    recorder = Recorder(overrides)
    cls = _recorded_class(ex, answer, recorder)
    if cls is None:
        return None
    _, outcomes = run_class(ex, cls, seed, file, time_limit)
    if answer is ex.target and any(o.error is not None for o in outcomes):
        return None  # numformer's own code failed when recorded: say nothing rather than something wrong
    return recorder.calls


# -- matching values --------------------------------------------------------------------------------------

def _views(a: np.ndarray, shape: tuple):
    """``a`` as an array of ``shape``: itself, reshaped, or its last two axes swapped (then reshaped)."""
    if a.shape == shape:
        yield a
    elif a.size == int(np.prod(shape)):
        yield a.reshape(shape)
    if a.ndim >= 2 and a.shape[-1] != 1 and a.shape[-2] != 1:
        t = a.swapaxes(-1, -2)
        if t.shape == shape and a.shape != shape:
            yield t
        elif t.size == int(np.prod(shape)) and t.shape != shape:
            yield t.reshape(shape)


def _same(a, b) -> bool:
    scale = max(float(np.abs(b).max()), float(np.abs(a).max()), 1e-300)
    return float(np.abs(a - b).max()) <= SAME * scale


def _factor(a, b):
    """c when ``a`` = c ``b`` with c not 1 (nor 0), else None."""
    bb = float((b * b).sum())
    if bb == 0.0:
        return None
    c = float((a * b).sum()) / bb
    if abs(c - 1.0) <= 1e-9 or abs(c) <= 1e-12:
        return None
    return c if float(np.linalg.norm(a - c * b)) <= SAME * max(float(np.linalg.norm(a)), 1e-300) else None


def _compare_call(ref, mine) -> dict:
    """{reference record index: ("right", student index) | ("scaled", c, student index) | ("missing",)} for one
    call. The arguments are given to both: the student's count as computing them, never as scaling them."""
    out = {}
    for r in ref.records:
        if r.given:
            out[r.index] = ("right", next((s.index for s in mine.records if s.given and s.code == r.code), None))
            continue
        status = ("missing",)
        for s in mine.records:
            for view in _views(s.value, r.value.shape):
                if _same(view, r.value):
                    status = ("right", s.index)
                    break
                if status[0] == "missing" and not s.given:
                    c = _factor(view, r.value)
                    if c is not None:
                        status = ("scaled", c, s.index)
            if status[0] == "right":
                break
        out[r.index] = status
    return out


# -- the data flow over every call --------------------------------------------------------------------------

@dataclass
class _Step:
    key: tuple
    record: object                  # the reference's record, in the first call it occurs in
    operands: set
    status: dict                    # call number -> status (see _compare_call)
    records: dict                   # call number -> the reference's record in that call


def _flow(ref_calls, my_calls) -> dict:
    """{key: _Step} over the calls the student's code returned from (a call that raised has no values past the
    error: its missing steps would be the error's consequence, which the error line already says)."""
    steps = {}
    for n, (ref, mine) in enumerate(zip(ref_calls, my_calls)):
        if not mine.returned:
            continue
        status = _compare_call(ref, mine)
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


def _first_steps(steps: dict) -> list:
    """The steps on the way to a wrong returned value that are wrong although all their operands are right."""
    ancestors, todo = set(), [s.key for s in _wrong_outputs(steps)]
    while todo:
        k = todo.pop()
        if k in ancestors:
            continue
        ancestors.add(k)
        todo += [o for o in steps[k].operands if o in steps]
    first = [steps[k] for k in ancestors if not _right(steps, k) and all(_right(steps, o) for o in steps[k].operands)]
    return sorted(first, key=lambda s: (min(s.status), s.record.index))


# -- naming a factor ----------------------------------------------------------------------------------------

_CONSTANTS = {"2": 2.0, "1/2": 0.5, "3": 3.0, "1/3": 1 / 3, "4": 4.0, "1/4": 0.25}


def _symbol_values(ex, args: dict) -> dict:
    values = {}
    for name, fn in ex.symbols.items():
        try:
            values[name] = float(fn(args))
        except Exception:  # noqa: BLE001  (a symbol this call's arguments do not define)
            continue
    for name, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in values:
            values[name] = float(value)
    return {k: v for k, v in values.items() if v > 0}


def _expressions(symbols: list) -> list:
    out = []
    for s in symbols:
        out += [(s, lambda v, s=s: v[s]), (f"1/{s}", lambda v, s=s: 1 / v[s]),
                (f"sqrt({s})", lambda v, s=s: math.sqrt(v[s])), (f"1/sqrt({s})", lambda v, s=s: 1 / math.sqrt(v[s])),
                (f"{s}^2", lambda v, s=s: v[s] ** 2), (f"1/{s}^2", lambda v, s=s: 1 / v[s] ** 2)]
    for a, b in itertools.combinations(symbols, 2):
        out += [(f"{a}*{b}", lambda v, a=a, b=b: v[a] * v[b]), (f"{a}/{b}", lambda v, a=a, b=b: v[a] / v[b]),
                (f"{b}/{a}", lambda v, a=a, b=b: v[b] / v[a]), (f"1/({a}*{b})", lambda v, a=a, b=b: 1 / (v[a] * v[b]))]
    return out


def name_factor(ex, factors: list, calls: list):
    """What the factors ``c_k`` of the calls ``calls`` (their arguments) equal in every call: a constant ("2",
    "-1"), a symbol of the exercise or an expression of them ("d", "sqrt(d_k)", "1/n"); None when nothing fits
    every call (a factor named from one case alone could be a coincidence)."""
    if any(c == 0 for c in factors) or (any(c < 0 for c in factors) and not all(c < 0 for c in factors)):
        return None
    sign = "-" if factors[0] < 0 else ""
    mags = [abs(c) for c in factors]
    if all(abs(m - 1) <= 1e-9 for m in mags):
        return "-1" if sign else None
    for name, value in _CONSTANTS.items():
        if all(abs(m - value) <= 1e-9 * value for m in mags):
            return sign + name
    values = [_symbol_values(ex, call.args) for call in calls]
    common = [s for s in values[0] if all(s in v for v in values)]
    for name, fn in _expressions(common):
        try:
            if all(abs(fn(v) - m) <= 1e-9 * m for v, m in zip(values, mags)):
                return sign + name
        except (ZeroDivisionError, ValueError):
            continue
    return None


# -- saying where entries differ ------------------------------------------------------------------------------

_AXES = {2: {0: "row", 1: "column"}, 3: {1: "row", 2: "column"}, 4: {1: "head", 2: "row", 3: "column"}}


def _pattern(ex, args: dict, got, ref) -> tuple:
    """(pattern, words) of where ``got`` differs from ``ref``, in the exercise's own terms when it can."""
    bad = relative_errors(got, ref, max(1e-3 * float(np.abs(ref).max()), 1e-300)) > WRONG
    n_bad, size = int(bad.sum()), bad.size
    c = _factor(got, ref)
    if c is not None:
        return None, f"it is numformer's times {c:.6g}"
    sets = {}
    try:
        given = ex.entry_sets(args, ref.shape) if ex.entry_sets is not None else {}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        given = {}
    for name, where in given.items():
        try:
            sets[name] = np.broadcast_to(np.asarray(where, dtype=bool), ref.shape)
        except ValueError:
            continue  # words for entries of another shape (the scores' mask, not the queries')
    live = (ref != 0) | (got != 0)  # where the two can differ at all (both zero: equal whatever was done)
    masked = sets.get("masked positions")
    kept = None if masked is None else ~masked & live
    if kept is not None and kept.any() and not got[~masked].any() and bad[kept].sum() >= 0.9 * kept.sum():
        return "mask reversed", ("it is zero at every position the mask keeps, where numformer's has the scores' "
                                 "gradient: the mask is applied the wrong way round (it keeps what it should zero)")
    for name, where in sets.items():
        if _exactly(bad, where & live):
            return name, f"it is wrong exactly at the {name} ({n_bad} of {size} entries) and right everywhere else"
    for name, where in sets.items():  # numformer's is zero there (padding takes no gradient), the student's not
        if where.any() and not ref[where].any() and (got[where] != 0).sum() >= 0.9 * where.sum():
            return name, (f"at the {name}, where numformer's is zero, it is not; it differs at {n_bad} of {size} "
                          "entries in all")
    if (ref == 0).any() and np.array_equal(got == 0, ref != 0):
        return None, "it is zero exactly where numformer's is not, and not zero where numformer's is"
    for axis, word in _AXES.get(bad.ndim, {}).items():
        hit = np.flatnonzero(bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis)))
        if len(hit) == 1 and bad.shape[axis] > 1:
            return word, f"it is wrong in one {word} only ({word} {hit[0]}: {n_bad} of {size} entries)"
    return None, f"it differs at {n_bad} of {size} entries"


def _exactly(bad, where) -> bool:
    """``bad`` lies inside ``where`` and covers at least 90% of it (an entry may agree by chance)."""
    return bool(where.any()) and not bad[~where].any() and bad[where].sum() >= 0.9 * where.sum()


def _label(ex, record) -> str:
    if record.code in ex.names:
        return ex.names[record.code]
    if record.variable and record.variable in ex.names:
        return ex.names[record.variable]
    if record.returned is not None and record.returned < len(ex.outputs):
        return f"the returned {ex.outputs[record.returned]}"
    return record.variable or record.code


# -- the student's counterpart of a missing step --------------------------------------------------------------

def _counterpart(r, ref_call, my_call, status):
    """(the student's record, its view) nearest to numformer's record ``r`` in one call, with a note when it
    uses something else in place of one of ``r``'s operands; (None, None, "") when there is none. Nearest: of
    ``r``'s shape, equal to no intermediate of numformer's, and computed only from operands of ``r`` (all of
    them right), or from them and one wrong array of the shape of the one operand it lacks."""
    right_of = {s[1]: i for i, s in status.items() if s[0] == "right" and s[1] is not None}  # student -> numformer
    wanted = set(r.operands)
    best = None
    for s in my_call.records:
        if s.given or s.index in right_of or s.kind == "name" or not _alike(r.kind, s.kind):
            continue
        view = next(iter(_views(s.value, r.value.shape)), None)
        if view is None:
            continue
        mapped = [right_of.get(o) for o in s.operands]
        right_ops = {m for m in mapped if m is not None}
        wrong_ops = [o for o, m in zip(s.operands, mapped) if m is None]
        if not right_ops or not right_ops <= wanted:
            continue
        note = ""
        if wrong_ops:
            lacking = [i for i in wanted - right_ops]
            if len(wrong_ops) != 1 or len(lacking) != 1:
                continue
            theirs, ours = my_call.records[wrong_ops[0]], ref_call.records[lacking[0]]
            if theirs.value.shape != ours.value.shape:
                continue
            note = (f"; it uses `{theirs.code}` (line {theirs.line}) where numformer's uses {ours.variable or ours.code}"
                    f", and they differ")
        if not wrong_ops and right_ops != wanted:
            note = (f"; numformer's is computed from {_names(ref_call, wanted)}, yours from "
                    f"{_names(ref_call, right_ops)}")
        rank = (bool(wrong_ops), -len(right_ops), float(np.abs(view - r.value).max()), s.index)
        if best is None or rank < best[0]:
            best = (rank, s, view, note)
    return (best[1], best[2], best[3]) if best else (None, None, "")


_FREE = ("call", "in place")  # a helper's call or an in-place update may be written any way


def _alike(ours: str, theirs: str) -> bool:
    """Whether the student's expression of kind ``theirs`` may be their way of computing numformer's of kind
    ``ours``: the same operator or array function, or either one a function call or an in-place update (numformer's
    ``scatter_add`` is a student's ``np.add.at``); never an unrelated array (``np.zeros_like(p)``)."""
    return ours == theirs or ours in _FREE or theirs in _FREE


def _names(call, indices) -> str:
    names = [call.records[i].variable or f"`{call.records[i].code}`" for i in sorted(indices)]
    return " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]


# -- the diagnosis ----------------------------------------------------------------------------------------------

def first_wrong_steps(ex, answer, seed: int = 0, file=None, time_limit=None) -> list:
    """The :class:`WrongStep` s of ``answer`` (a function or a layer class), in numformer's data-flow order, at
    most :data:`MOST`; [] when its code or numformer's cannot be recorded, or the calls do not line up."""
    my_calls = recorded_calls(ex, answer, seed, file, time_limit)
    if not my_calls:
        return []
    overrides, out, said_keys = {}, [], set()
    for _ in range(MOST):
        ref_calls = recorded_calls(ex, ex.target, seed, overrides=overrides)
        if not ref_calls or len(ref_calls) != len(my_calls):
            return out
        steps = _flow(ref_calls, my_calls)
        firsts = [s for s in _first_steps(steps) if s.key not in said_keys]
        if not firsts:
            break
        step = firsts[0]
        said, replacements = _say(ex, step, ref_calls, my_calls)
        if said.note and said.note in {s.note for s in out}:  # the same wrong operand again: one mistake, said once
            said = None
        else:
            out.append(said)
        said_keys.add(step.key)
        if replacements is None:  # never computed: nothing to replay numformer's with
            out += _outputs(ex, steps, ref_calls, my_calls, said_keys)
            break
        overrides.update({(n, step.key): v for n, v in replacements.items()})
    return out[:MOST]


def _replay(step, my_calls, mine) -> dict:
    """{call number: the student's value of the same expression as ``mine``, as numformer's step's shape}, for
    every call holding both: numformer's reference is replayed with it, in every case alike (a case where the
    two agree by chance, y = 1 in a row of one entry, must not make the next step look wrong)."""
    out = {}
    for n, r in step.records.items():
        theirs = next((s for s in my_calls[n].records if s.key == mine.key), None) if n < len(my_calls) else None
        view = next(iter(_views(theirs.value, r.value.shape)), None) if theirs is not None else None
        if view is not None:
            out[n] = view
    return out


def _say(ex, step, ref_calls, my_calls) -> tuple:
    """(WrongStep, {call number: the student's value to replay numformer's with} or None)."""
    rec = step.record
    label = _label(ex, rec)
    where = "" if label == rec.code else f" (numformer's `{rec.code}`)"
    wrong = sorted(n for n, s in step.status.items() if s[0] != "right")
    if all(step.status[n][0] == "scaled" for n in wrong):
        calls = sorted(step.status)
        factors = [step.status[k][1] if step.status[k][0] == "scaled" else 1.0 for k in calls]
        named = name_factor(ex, factors, [ref_calls[k] for k in calls])
        mine = my_calls[wrong[0]].records[step.status[wrong[0]][2]]
        values = ", ".join(f"{c:.6g}" for c in factors)
        what = f"{named} times numformer's" if named else f"numformer's times {values} in the calls of the cases"
        said = (f"first wrong step: {label}{where}: your line {mine.line} (`{mine.code}`) is {what}"
                + (f" ({named} = {values} in the calls of the cases)" if named and len(set(factors)) > 1 else ""))
        return WrongStep(label, rec.code, rec.variable, mine.line, named, None, said), _replay(step, my_calls, mine)
    n = wrong[0]
    mine, view, note = _counterpart(step.records[n], ref_calls[n], my_calls[n], _compare_call(ref_calls[n], my_calls[n]))
    if mine is None:
        said = f"first wrong step: {label}{where}: your code never computes it from the right operands"
        return WrongStep(label, rec.code, rec.variable, None, None, None, said), None
    pattern, words = _pattern(ex, ref_calls[n].args, view, step.records[n].value)
    said = f"first wrong step: {label}{where}: your line {mine.line} (`{mine.code}`) computes it differently: " \
           f"{words}{note}"
    return WrongStep(label, rec.code, rec.variable, mine.line, None, pattern, said, note), _replay(step, my_calls, mine)


def _outputs(ex, steps, ref_calls, my_calls, said_keys) -> list:
    """The wrong returned values, each with where it differs, when the student never computes a step: what the
    student does return is still worth a pattern (padding rows that got gradient)."""
    out = []
    for step in _wrong_outputs(steps):
        if step.key in said_keys:
            continue
        n = min(k for k, s in step.status.items() if s[0] != "right")
        r = step.records[n]
        mine = next((s for s in my_calls[n].records if s.returned == r.returned), None)
        view = next(iter(_views(mine.value, r.value.shape)), None) if mine is not None else None
        if view is None:
            continue
        pattern, words = _pattern(ex, ref_calls[n].args, view, r.value)
        label = ex.outputs[r.returned] if r.returned < len(ex.outputs) else _label(ex, r)
        out.append(WrongStep(label, r.code, r.variable, mine.line, None, pattern,
                             f"the returned {label}: your line {mine.line} (`{mine.code}`): {words}"))
    return out
