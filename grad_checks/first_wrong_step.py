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
"""
from __future__ import annotations

from dataclasses import dataclass

from .candidates import run_class
from .counterparts import compare_call, counterpart, views
from .entry_patterns import entry_pattern
from .factor_names import name_factor
from .recorded_run import Recorder, recorded

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


def _ancestors(steps, keys) -> set:
    found, todo = set(), list(keys)
    while todo:
        k = todo.pop()
        if k in found:
            continue
        found.add(k)
        todo += [o for o in steps[k].operands if o in steps]
    return found


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

        def verify(n, value, step=step, base=dict(overrides)):
            """The step's consumers right in call n once numformer's is replayed with ``value`` there."""
            calls = recorded_calls(ex, ex.target, seed, overrides={**base, (n, step.key): value})
            if not calls or len(calls) != len(my_calls):
                return False
            status = compare_call(calls[n], my_calls[n])
            after = [r for r in calls[n].records if step.key in {calls[n].records[o].key for o in r.operands}]
            return bool(after) and all(status[r.index][0] == "right" for r in after)

        said, replacements = _say(ex, step, ref_calls, my_calls, verify)
        if not (said.note and said.note in {s.note for s in out}):  # the same wrong operand: one mistake, said once
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
        view = next(iter(views(mine.value, r.value.shape)), None) if mine is not None else None
        if view is None:
            continue
        pattern, words = entry_pattern(ex, ref_calls[n].args, view, r.value)
        label = ex.outputs[r.returned] if r.returned < len(ex.outputs) else _label(ex, r)
        out.append(WrongStep(label, r.code, r.variable, mine.line, None, pattern,
                             f"the returned {label}: your line {mine.line} (`{mine.code}`): {words}"))
    return out

