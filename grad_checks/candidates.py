"""Candidates for an exercise's backward, run alike and compared: numformer's reference, a student's code, a
catalogued mistake, a mutant.

A candidate (a function or method, or a whole layer class) runs inside numformer's layer class on the
exercise's cases (:meth:`grad_checks.exercise.Exercise.cases`), every candidate's layer built alike, and
gives an :class:`Outcome` per case: its gradients by tensor, or the error that stopped it. Two outcomes
*agree* when their gradients are equal to the finite-difference tolerance (or they failed the same way);
:func:`closest` picks, among candidates, the one that agrees with an answer on every case. The grading
(grad_checks/grading.py) and the locating of a mistake (grad_checks/locate.py) both stand on this.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numformer.finite_differences import TINY, LayerContractError, analytic_gradients, validate_gradients
from numformer.finite_differences.tangent_checks import analytic_tangents
from numformer.user_code import exception_line, where

from numformer.user_code_clock import StudentCodeTimeout, deadline
from .exercise import Exercise, OutputMismatch

EXACT = 1e-10   # worst relative error of a gradient equal to numformer's up to round-off
APPROX = 1e-6   # the finite-difference tolerance: below it a gradient is right, if not to the last bit
FLOOR_RATIO = 1e-3  # the error's floor: this fraction of the case's largest gradient (as run_case)


@dataclass
class Outcome:
    """One candidate on one case: its gradients by tensor, or the error that stopped it."""

    grads: dict | None = None
    error: str | None = None
    signature: tuple | None = None  # what failed, to recognise a mistake failing the same way
    raw: tuple | None = None        # what a function returned when its outputs were refused
    not_implemented: bool = False

    @property
    def output(self) -> bool:
        """Whether there is something to compare: gradients, or the arrays a refused function returned."""
        return self.grads is not None or self.raw is not None

    @property
    def ran(self) -> bool:
        """Whether the code returned: gradients, or outputs refused for their shape (what the guard or the layer
        said of them); not an exception ("raised ...")."""
        return self.output or not (self.error or "").startswith("raised ")

    @property
    def raised(self) -> bool:
        """An exception and nothing else: the error line is all there is to compare."""
        return self.error is not None and not self.output


def run_class(ex: Exercise, cls: type, seed: int = 0, file=None, time_limit: float | None = None,
              order=None, each=None) -> tuple:
    """(cases, outcomes) of the layer class ``cls`` on the exercise's cases.

    ``order``: the case numbers (from 0) in the order to run them (default: as listed); the outcomes are in
    the cases' order either way (grad_checks/kept_state.py runs them backwards); a case not run has None.
    ``each(i)`` is called before case ``i`` runs (a recording notes which case its calls belong to).

    ``time_limit`` (seconds): a student's code runs under a clock (numformer/user_code_clock.py), building the layers
    and each case; one that does not return in time raises StudentCodeTimeout, which stops the grading (None:
    no clock, for numformer's own code: the reference, the mistakes, the mutants).
    """
    try:
        with deadline(time_limit, "building the layers of the cases", file):
            cases = ex.cases(cls, seed)
    except StudentCodeTimeout:
        raise
    except Exception as exc:  # noqa: BLE001  (a student's class whose constructor differs from numformer's)
        return [], [Outcome(error=f"the layer could not be built: {exception_line(exc, file)}",
                            signature=("build", type(exc).__name__))]
    outcomes = [None] * len(cases)
    for i in (range(len(cases)) if order is None else order):
        case = cases[i]
        if each is not None:
            each(i)
        # the clock outside the try: its _Deadline gets through the except clauses, its StudentCodeTimeout
        # (an Exception) is raised after them, not recorded as the case's outcome
        with deadline(time_limit, f"case {i + 1} of {len(cases)} ({case.case})", file):
            outcomes[i] = _outcome(case, seed, i, file, ex.mode)
    return cases, outcomes


def _outcome(case, seed: int, i: int, file, mode: str = "backward") -> Outcome:
    """One case's forward and backward (``mode``: the exercise's; in forward mode the JVPs or the backward's
    tangents, numformer.finite_differences.tangent_checks): its gradients, or the error that stopped it."""
    try:
        # [seed, i, 2], not [seed, i]: numpy pads a seed with zeros, so [seed, 0] is the stream the case
        # builders drew the inputs from, and case 1's upstream gradient would repeat its inputs (ReLU: dy == x)
        rng = np.random.default_rng([seed, i, 2])
        tensors = analytic_gradients(case, rng)[1] if mode == "backward" else analytic_tangents(case, rng, mode)
        validate_gradients(tensors, case.layer)
        return Outcome(grads={name: g for name, _, g in tensors})
    except NotImplementedError as exc:
        return Outcome(error=f"NotImplementedError at {where(exc, file)}", not_implemented=True,
                       signature=("not implemented",))
    except OutputMismatch as exc:
        return Outcome(error=str(exc), signature=exc.signature, raw=exc.raw)
    except LayerContractError as exc:
        return Outcome(error=str(exc), signature=("contract", str(exc)))
    except Exception as exc:  # noqa: BLE001  (whatever the candidate raises)
        return Outcome(error=f"raised {exception_line(exc, file)}",
                       signature=(type(exc).__name__, str(exc).strip().splitlines()[:1]))
    finally:
        case.module.clear_cache()


def run_function(ex: Exercise, fn, seed: int = 0, file=None, guard: bool = True) -> tuple:
    """(cases, outcomes) of the function or method ``fn`` put in numformer's layer class."""
    return run_class(ex, ex.layer_class(fn, guard=guard), seed, file)


def floor(grads: dict) -> float:
    return max(FLOOR_RATIO * max([float(np.abs(g).max()) for g in grads.values() if g.size] + [0.0]), TINY)


def relative_errors(got, ref, tiny: float):
    """Entrywise ``|a - b| / max(|a| + |b|, tiny)`` of ``got`` against ``ref`` (a boolean array as 0 and 1: a mask
    returned as the gradient)."""
    got, ref = (np.asarray(a, dtype=np.float64) if np.asarray(a).dtype == bool else a for a in (got, ref))
    return np.abs(got - ref) / np.maximum(np.abs(got) + np.abs(ref), tiny)


def constant_factor(got, ref):
    """c when ``got`` is ``c`` times ``ref`` (to 1e-8 of its norm), else None."""
    rr = float((ref * ref).sum())
    if rr == 0:
        return None
    c = float((got * ref).sum()) / rr
    return c if np.linalg.norm(got - c * ref) <= 1e-8 * max(np.linalg.norm(got), 1e-300) else None


def compare(got, ref, tiny: float) -> tuple:
    """(worst relative error, index of the worst entry) of ``got`` against ``ref``."""
    if got.size == 0:
        return 0.0, ()
    diff = relative_errors(got, ref, tiny)
    i = int(np.argmax(diff))
    return float(diff.flat[i]), tuple(int(j) for j in np.unravel_index(i, ref.shape))


def verdict(error: float) -> str:
    return "exact" if error <= EXACT else "approximate" if error <= APPROX else "wrong"


def agreement(mine: Outcome, theirs: Outcome, reference: Outcome):
    """The worst error between two candidates' outcomes on one case, or None when they disagree."""
    if mine.error is not None or theirs.error is not None:
        if mine.signature != theirs.signature:
            return None
        if mine.raw is not None and theirs.raw is not None:
            worst = 0.0
            for a, b in zip(mine.raw, theirs.raw):
                if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
                    return None
                if a is not None and a.size:
                    err, _ = compare(a, b, max(FLOOR_RATIO * float(np.abs(b).max()), TINY))
                    worst = max(worst, err)
            return worst if worst <= APPROX else None
        return 0.0
    tiny = floor(reference.grads) if reference.grads else TINY
    worst = 0.0
    for name, g in mine.grads.items():
        if name not in theirs.grads:
            return None
        worst = max(worst, compare(g, theirs.grads[name], tiny)[0])
    return worst if worst <= APPROX else None


def closest(candidates, mine: list, reference: list):
    """(key, worst error) of the candidate whose outcomes agree with ``mine`` on every case (the closest, if
    several), or None. ``candidates``: (key, outcomes) pairs, the outcomes on the same cases as ``mine``."""
    best = None
    for key, theirs in candidates:
        worst = 0.0
        for a, b, r in zip(mine, theirs, reference):
            agree = agreement(a, b, r)
            if agree is None:
                worst = None
                break
            worst = max(worst, agree)
        if worst is not None and (best is None or worst < best[1]):
            best = (key, worst)
    return best
