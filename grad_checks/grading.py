"""Grading a student's backward: against numformer's own, against finite differences, and the mistake named.

For an exercise (grad_checks/exercise.py) and the student's function or method, every
*candidate* (numformer's reference, the student's code, each catalogued mistake) runs in
numformer's layer class on the exercise's cases, each candidate's layer built alike (same
weights, inputs, masks, replayed dropout masks and upstream gradients), in float64 on the plain
math (``NUMFORMER_KERNELS=plain``). Then, per case and per tensor (every parameter's gradient
and every input's):

* the student's gradient against numformer's: **exact** (equal to round-off: worst error below
  1e-10), **approximate** (below 1e-6, the finite-difference tolerance: a right formula computed
  with less precision) or **wrong**, with the index of the worst entry. The error is
  ``|a - b| / max(|a| + |b|, tiny)`` with tiny 1e-3 of the case's largest gradient, as in the
  finite-difference check (numformer/finite_differences/), so entries that are zero by symmetry do not
  turn round-off into "wrong";
* the student's gradient against central differences (:func:`numformer.finite_differences.run_case`), an
  oracle that does not trust numformer's backward either.

When the student's code is wrong: what numformer's code, edited, computes the same gradients with (the
catalogue, then single edits: grad_checks/locate.py) names the mistake as arithmetic; the first wrong step
(grad_checks/first_wrong_step.py) names the student's line, only where the value it must hold is known. An
exception, NotImplementedError, a wrong shape or NaN in the student's code is one line each, never a traceback;
so is a case that does not return within the time limit (numformer/user_code_clock.py), which stops the grading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from numformer.finite_differences import run_case
from numformer.finite_differences.central_differences import GradientShapeError
from numformer.finite_differences.tangent_checks import run_tangent_case
from numformer.user_code import exception_line
from numformer.user_code_clock import StudentCodeTimeout
from numformer.kernels import kernel_mode

from .candidates import (APPROX, EXACT, Outcome, compare, constant_factor, floor, relative_errors, run_class,
                         run_function, verdict)
from numformer.user_code_clock import DEFAULT_TIME_LIMIT, deadline
from .exercise import Exercise, OutputMismatch
from .first_wrong_step import Recordings, first_wrong_steps, precision_steps, raising_steps
from .kept_state import kept_state, snapshot
from .own_code import describe, watch
from .raised_line import raised_line
from .locate import located_sentence, reproduced, same_error, same_error_sentence, wrong_entries



# The finite differences are the second opinion here (numformer's backward is the first, entry by entry): every
# entry of a tensor up to this size, else 8 sampled entries and 3 random directions (the default, 64, probes
# every entry of a decoder layer's 8 x 8 matrices: 1,384 probes, 2 s a check; this: under a second).
FD_FULL_SIZE = 16


@dataclass
class TensorGrade:
    tensor: str
    shape: tuple
    verdict: str            # exact / approximate / wrong
    error: float
    index: tuple
    mine: float = 0.0       # the student's and numformer's values at the worst entry
    theirs: float = 0.0
    fd: object = None       # the finite-difference TensorResult, when run


@dataclass
class CaseGrade:
    name: str
    tensors: list = field(default_factory=list)
    error: str | None = None


@dataclass
class Grade:
    """The whole grade of one student's code: per case and tensor, the mistake, the hints, the verdict."""

    exercise: Exercise
    who: str
    cases: list = field(default_factory=list)
    not_implemented: str | None = None
    mistake: str | None = None
    location: str | None = None  # the mistake located to a term, when no catalogued one explains it
    raised: bool = False  # every case stopped at an exception: the error line is where it went wrong
    steps: list = field(default_factory=list)  # the first wrong steps (grad_checks/first_wrong_step.py)
    not_yours: str | None = None  # numformer's own backward called (grad_checks/own_code.py): what and where
    own_uses: list = field(default_factory=list)  # each use of it (grad_checks/own_code.py's OwnCall)
    keeps_state: str | None = None  # a case's outcome changes with the calls before it (grad_checks/kept_state.py)
    kept_lines: tuple = ()          # the student's lines that read or set what keeps the state
    raised_at: str | None = None    # what the line that raised reads, in the exercise's terms (raised_line.py)
    hints: list = field(default_factory=list)
    check_command: str = ""

    @property
    def tensors(self) -> list:
        return [t for c in self.cases for t in c.tensors]

    @property
    def errors(self) -> list:
        return [c.error for c in self.cases if c.error is not None]

    @property
    def raised_cases(self) -> list:
        """The numbers (from 1) of the cases that stopped at an error."""
        return [i for i, c in enumerate(self.cases, 1) if c.error is not None]

    @property
    def passed(self) -> bool:
        return (self.not_implemented is None and self.not_yours is None and self.keeps_state is None
                and not self.errors and bool(self.tensors)
                and all(t.verdict != "wrong" and (t.fd is None or t.fd.passed) for t in self.tensors))

    @property
    def exact(self) -> bool:
        return self.passed and all(t.verdict == "exact" for t in self.tensors)

    def summary(self) -> str:
        """One line: EXACT / APPROXIMATE / WRONG (and the mistake) / ERROR / NOT IMPLEMENTED."""
        if self.not_implemented:
            return f"NOT IMPLEMENTED: {self.not_implemented}"
        if self.not_yours:
            return f"NOT YOURS: {self.not_yours}"
        if self.keeps_state:
            return "WRONG: " + self.keeps_state.split(". A backward must")[0]
        named = f": the catalogued mistake {self.mistake}" if self.mistake else \
            ": the mistake located (see the diagnosis)" if self.location or any(s.proven for s in self.steps) else \
            ": the lines that could hold the mistake named (see the diagnosis)" if self.steps else ""
        wrong = [t for t in self.tensors if t.verdict == "wrong" or (t.fd is not None and not t.fd.passed)]
        if self.errors:
            raised = self.raised_cases
            if len(raised) == len(self.cases):
                return f"ERROR{named}: {self.errors[0]}"
            ran_wrong = [i for i, c in enumerate(self.cases, 1) if c.error is None and any(t in wrong for t in c.tensors)]
            # the cases that raised and those that ran told apart: a fix for the error may leave the others wrong
            return (f"ERROR{named}: {_cases(raised)} of {len(self.cases)} raised ({self.errors[0]}); "
                    + (f"{_cases(ran_wrong)} ran and {'was' if len(ran_wrong) == 1 else 'were'} wrong" if ran_wrong
                       else "the others ran and were right"))
        if wrong:
            return f"WRONG{named}: {len(wrong)} of {len(self.tensors)} tensors wrong"
        if self.exact:
            return f"EXACT: all {len(self.tensors)} tensors equal numformer's to round-off"
        worst = max(t.error for t in self.tensors)
        return (f"APPROXIMATE: agrees to {worst:.1e}, within the tolerance ({APPROX:.0e}) but not to round-off "
                f"({EXACT:.0e}): " + ("a step computes in low precision (see the diagnosis)" if self.steps else
                                      "a step loses precision"))

    def __str__(self) -> str:
        ex = self.exercise
        if self.not_implemented:
            return f"{ex.student_name} is not implemented yet ({self.not_implemented}): write its body, then run " \
                   f"{self.check_command or 'the check'} again"
        lines = [f"grading {self.who} against {ex.reference_name} (float64, plain math)"]
        for i, case in enumerate(self.cases, 1):
            lines.append(f"\ncase {i} of {len(self.cases)}: {case.name}")
            if case.error is not None:
                lines.append(f"  ERROR: {case.error}")
                continue
            w = max([len("tensor")] + [len(t.tensor) for t in case.tensors])
            ws = max([len("shape")] + [len(str(t.shape)) for t in case.tensors])
            lines.append(f"  {'tensor':<{w}}  {'shape':<{ws}}  {'vs numformer':<24}  finite differences")
            for t in case.tensors:
                at = f" at {t.index}" if t.verdict == "approximate" else ""
                vs = f"{t.verdict.upper() if t.verdict == 'wrong' else t.verdict:<11} {t.error:.1e}{at}"
                fd = "" if t.fd is None else f"{'pass' if t.fd.passed else 'FAIL'}  {t.fd.max_rel_error:.1e}"
                lines.append(f"  {t.tensor:<{w}}  {str(t.shape):<{ws}}  {vs:<24}  {fd}")
                if t.verdict == "wrong":
                    lines.append(f"  {'':<{w}}  worst at {t.index}: yours {t.mine:+.6g}, numformer's {t.theirs:+.6g}")
        lines.append("")
        if self.keeps_state:
            lines.append(f"diagnosis: {self.keeps_state}")
        if self.mistake:
            lines.append(f"diagnosis: {self.mistake}: {ex.explanation(ex.mistake_names[self.mistake])}")
        elif self.location:
            lines.append(f"diagnosis: {self.location}")
        if self.raised_at:
            lines.append(f"diagnosis: {self.raised_at}")
        for step in self.steps:
            lines.append(step.said)
        if self.not_yours:
            why = ("the exercise is to write that backward in the graded process, where its work can be seen"
                   if self.not_yours.startswith("starts a process") else
                   "the exercise is to write that backward; numformer's own is what it is graded against, so calling "
                   "it proves nothing")
            lines.append(f"not yours: your code {self.not_yours}: {why}")
        for hint in self.hints:
            lines.append(f"hint: {hint}")
        lines.append(f"result: {self.summary()}")
        return "\n".join(lines)


# The worst relative error a float32 step in a float64 computation leaves: float32's unit roundoff (6e-8) grown
# by the sums of a backward (a few hundred terms at the exercises' sizes) and cancellation: 64 x 2^-23 = 7.6e-6.
FLOAT32_ROUNDING = 64 * float(np.finfo(np.float32).eps)


def _describe_wrong(name: str, got, ref, tiny: float) -> str | None:
    """What a wrong gradient no catalogued mistake explains looks like, when it has a recognisable form (float32
    precision, all zeros, a constant factor); None otherwise (its wrong entries are said apart)."""
    diff = relative_errors(got, ref, tiny)
    if diff.max() <= FLOAT32_ROUNDING:
        return (f"your gradient of {name} is close to numformer's (worst {diff.max():.1e}) but not within {APPROX:.0e}: "
                "is a step computed in float32 (an array or a constant)? The check runs in float64")
    if diff.max() <= 1e-3:  # too far for float32's rounding (a student was once asked about float32 at 7.7e-4)
        return (f"your gradient of {name} is close to numformer's (worst {diff.max():.1e}) but farther than float32's "
                f"rounding (up to {FLOAT32_ROUNDING:.0e}) could take it: a small term missing or extra, or a "
                "constant slightly off (an epsilon in the wrong place)?")
    if not np.any(got):
        return f"your gradient of {name} is all zeros (was it added into .grad, in place?)"
    c = constant_factor(got, ref)
    if c is None:
        return None
    if abs(c + 1) < 1e-6:
        return f"your gradient of {name} is numformer's with the sign flipped"
    return f"your gradient of {name} is numformer's times {c:.6g} (a factor missing or extra?)"


def grade(ex: Exercise, answer, who: str | None = None, file=None, seed: int = 0, finite_differences: bool = True,
          diagnose: bool = True, check_command: str = "", time_limit: float | None = DEFAULT_TIME_LIMIT) -> Grade:
    """Grade the student's ``answer`` on ``ex``: a function (or a method, for a composition) put in numformer's
    layer class, or a whole layer class as it is (what ``train.py --swap`` trains with, helpers and all).

    Every run of the answer (building the layers, each case, each case's finite differences) has ``time_limit``
    seconds (numformer/user_code_clock.py; None or 0: none): one that does not return raises StudentCodeTimeout, naming
    the case and the line of ``file`` it was at."""
    cls = answer if isinstance(answer, type) else ex.layer_class(answer)
    with kernel_mode("plain"):
        _, reference = run_function(ex, ex.target, seed, guard=False)
        with watch(ex, file, answer) as own:  # numformer's own backward called from the student's file
            before = snapshot(answer)
            cases, mine = run_class(ex, cls, seed, file, time_limit)
            state = None
            if not any(o.not_implemented for o in mine):  # the cases again, backwards: state between calls
                state = kept_state(ex, cls, answer, seed, file, time_limit, mine, reference, before)
        result = Grade(ex, who or ex.student_name, check_command=check_command)
        result.keeps_state, result.kept_lines = (state.said, state.lines) if state is not None else (None, ())
        stopped = next((o for o in mine if o.not_implemented), None)
        if stopped is not None:
            result.not_implemented = stopped.error
            return result
        result.raised = all(o.raised for o in mine)
        for case, me, ref in zip(cases or [None] * len(mine), mine, reference):
            cg = CaseGrade(case.case if case is not None else "building the layer")
            result.cases.append(cg)
            if me.error is not None:
                cg.error = me.error
                continue
            _grade_tensors(cg, me, ref)
        if finite_differences and cases:
            with deadline(time_limit, "building the layers of the cases for the finite differences", file):
                fresh = ex.cases(cls, seed)  # new layers: run_case perturbs weights and inputs in place
            for i, (case, cg) in enumerate(zip(fresh, result.cases)):
                if cg.error is not None:
                    continue
                with deadline(time_limit, f"the finite differences of case {i + 1} of {len(fresh)} ({case.case})",
                              file):
                    rng = np.random.default_rng([seed, i, 1])
                    try:
                        checked = (run_case(case, rng, full_size=FD_FULL_SIZE) if ex.mode == "backward" else
                                   run_tangent_case(case, rng, explicit_zeros=True))  # forward mode's differences
                    except Exception as exc:  # noqa: BLE001  (the student's code raising there, and only that)
                        if not (_raised_in(exc, file) or isinstance(exc, (GradientShapeError, OutputMismatch))):
                            raise
                        # it ran on the graded cases and raises on these (new layers, after more calls): said, and
                        # the case's differences left out, never an internal error
                        said = f"returned {exc}" if isinstance(exc, GradientShapeError) else \
                            "returned " + str(exc).split(" returned ", 1)[-1] if isinstance(exc, OutputMismatch) else \
                            f"raised {exception_line(exc, file)}"
                        result.hints.append(f"case {i + 1}'s finite differences: your code {said}, where it ran on the "
                                            "graded case: does it keep something from an earlier call?")
                        continue
                by_name = {r.tensor: r for r in checked}
                for t in cg.tensors:
                    t.fd = by_name.get(t.tensor)
        # code that hands numformer's own result on is not the student's, right or wrong: nothing of it to diagnose
        result.own_uses, result.not_yours = list(own), describe(own) if own else None
        if diagnose and not result.passed and not result.not_yours:
            # a backward that keeps state computes another function at every call: matching one pass of it to a
            # catalogued mistake or a single edit would blame a step it may have right; its steps are still shown
            found = None if result.keeps_state else reproduced(ex, mine, reference, seed)
            recordings = Recordings(ex, answer, seed, file, time_limit)  # each run recorded once, for both readers
            result.mistake = found[1] if found is not None and found[0] == "mistake" else None
            if result.mistake is None and not result.keeps_state:
                _locate(result, ex, mine, reference, seed, found)
            # the student's line, where the value it must hold is known: a catalogued mistake names what is wrong, the
            # step where (proven as any other: never by the match); state kept between calls is located by the lines
            # that read or set it (a step found by replaying one pass would be of another function at every call)
            # (a case returning a gradient of the wrong shape ran, as one with an output: its steps can be found)
            if any(o.ran for o in mine) and not result.kept_lines:
                result.steps = first_wrong_steps(ex, answer, seed, file, time_limit, recordings)
            raised = next(((k, c) for k, c in enumerate(result.cases, 1) if (c.error or "").startswith("raised ")),
                          None)
            if raised is not None:  # the raising line in the exercise's terms (grad_checks/raised_line.py)
                result.raised_at = raised_line(ex, answer, seed, file, time_limit, raised[0], raised[1].name,
                                               raised[1].error, recordings)
                if not result.steps and not result.kept_lines:  # raised everywhere: a step an edit proves, if any
                    result.steps = raising_steps(ex, answer, seed, file, time_limit, mine, reference)
        elif diagnose and result.passed and not result.exact and not result.not_yours:
            # within the tolerance, not to round-off: the lines computing in float32, if any
            result.steps = precision_steps(Recordings(ex, answer, seed, file, time_limit))
    return result


def _raised_in(exc, file) -> bool:
    """Whether the exception is the student's code's: raised in their file, or in what it called (numpy; a child
    layer of numformer's handed arrays of the wrong shape), with no frame of the grader's after their last one."""
    if file is None or isinstance(exc, (StudentCodeTimeout, KeyboardInterrupt)):
        return False
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(str(Path(tb.tb_frame.f_code.co_filename).resolve()))
        tb = tb.tb_next
    target = str(Path(file).resolve())
    theirs = [k for k, f in enumerate(frames) if f == target]
    ours = [k for k, f in enumerate(frames) if "/grad_checks/" in f]
    return bool(theirs) and (not ours or max(theirs) > max(ours))


def _locate(result: Grade, ex: Exercise, mine: list, reference: list, seed: int, found) -> None:
    """No catalogued mistake explains the answer: the single edit of numformer's backward that does (``found``), the
    edits that raise the student's very error, or which gradients and entries are wrong (grad_checks/locate.py)."""
    raising = same_error(ex, mine, seed)
    if raising:
        result.location = same_error_sentence(ex, raising)
        return
    if found is not None:
        result.location = located_sentence(ex, found[1]) + _right_and_wrong(result)
        return
    result.hints += _hints(result, mine, reference)
    if any(t.verdict == "wrong" for t in result.tensors):
        raised = result.raised_cases
        over = "over every case" if not raised else \
            f"over the {len(result.cases) - len(raised)} cases that ran ({_cases(raised)} raised)"
        result.hints.append(f"{over}: " + _right_and_wrong(result)[2:-1].replace("wrong as a result", "wrong"))
    for k, (case, me, ref) in enumerate(zip(result.cases, mine, reference), 1):  # the first case with a wrong one
        if me.error is not None or not any(t.verdict == "wrong" for t in case.tensors):
            continue
        for t in case.tensors:
            if t.verdict == "wrong" and t.tensor in me.grads:
                result.hints.append(wrong_entries(t.tensor, me.grads[t.tensor], ref.grads[t.tensor],
                                                  floor(ref.grads), APPROX) + f" (case {k}: {case.name})")
        break


def _cases(numbers: list) -> str:
    """"case 2", "cases 1 and 3", "cases 1, 2 and 4"."""
    if len(numbers) == 1:
        return f"case {numbers[0]}"
    return "cases " + ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"


def _right_and_wrong(result: Grade, cases=None) -> str:
    """" (wrong as a result: input:x; right: weight, bias)": the gradients the mistake touches and those it leaves
    right, over ``cases`` (every case by default)."""
    wrong, right = [], []
    for t in [t for c in (result.cases if cases is None else cases) for t in c.tensors]:
        bad = t.verdict == "wrong" or (t.fd is not None and not t.fd.passed)
        (wrong if bad else right).append(t.tensor)
    wrong = list(dict.fromkeys(wrong))
    right = [t for t in dict.fromkeys(right) if t not in wrong]
    if not wrong:
        return ""
    return f" (wrong as a result: {', '.join(wrong)}" + (f"; right: {', '.join(right)})" if right else ")")


def _hints(result: Grade, mine: list, reference: list) -> list:
    """The first case's worst wrong tensor, described when its form is recognisable (no catalogued mistake
    explains the answer)."""
    for case, me, ref in zip(result.cases, mine, reference):
        if me.error is None and case.tensors:
            worst = max(case.tensors, key=lambda t: t.error)
            if worst.verdict == "wrong" and worst.tensor in me.grads:
                said = _describe_wrong(worst.tensor, me.grads[worst.tensor], ref.grads[worst.tensor],
                                       floor(ref.grads))
                return [f"{case.name}: {said}"] if said else []
    return []


def _grade_tensors(cg: CaseGrade, mine: Outcome, reference: Outcome) -> None:
    """Each tensor of the reference's gradients against the candidate's: verdict, worst error and where."""
    tiny = floor(reference.grads)
    for name, g in reference.grads.items():
        if name not in mine.grads:
            cg.tensors.append(TensorGrade(name, tuple(g.shape), "wrong", float("inf"), ()))
            continue
        err, idx = compare(mine.grads[name], g, tiny)
        cg.tensors.append(TensorGrade(name, tuple(g.shape), verdict(err), err, idx,
                                      float(mine.grads[name][idx]) if idx else 0.0, float(g[idx]) if idx else 0.0))
