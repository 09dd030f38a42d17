"""What numformer's code, edited, computes the student's gradients with: a catalogued mistake, or one edit.

One search, two sources of the same kind of candidate (a function with the reference's signature, run in the layer
on the exercise's cases, grad_checks/candidates.py): the exercise's catalogue of classic mistakes, hand-written
beside it, then every single-edit mutant of numformer's backward (grad_checks/mutants.py: a term dropped, a sign
flipped, a factor or a transpose dropped, operands swapped, a sum made a mean, a reduction over the wrong axis, a
masking or a child's backward skipped, returned values swapped). The first whose gradients agree with the student's
on every case, to the finite-difference tolerance (the closest among those of one source), explains the answer: a
catalogued mistake by its name and explanation, a mutant as "your dx is right except that the term `xhat * ...`
enters with a + sign". Neither names a line of the student's: that is the first wrong step's
(grad_checks/first_wrong_step.py), where an edit of the student's own line is only ever a suggested fix. A student's
code that raises has no output to compare: when at most four mutants raise the very same error (type and message)
on every case, they are named. Otherwise :func:`wrong_entries` says, for each gradient, which entries are wrong.

The mutants' gradients are computed once per exercise and seed and kept (``_OUTCOMES``): grading many answers, or
every mutant (``python -m grad_checks mutants``), runs each mutant once.
"""
from __future__ import annotations

import numpy as np

from .candidates import closest, constant_factor, relative_errors, run_function
from .mutants import mutants

_OUTCOMES: dict = {}  # (exercise name, seed) -> [(Mutant, outcomes)]


def mutant_outcomes(ex, seed: int = 0) -> list:
    """[(mutant, its outcomes on the exercise's cases)] for every single-edit mutant of the reference."""
    key = (ex.name, seed)
    if key not in _OUTCOMES:
        _OUTCOMES[key] = [(m, run_function(ex, m.function, seed)[1]) for m in mutants(ex)]
    return _OUTCOMES[key]


def located_sentence(ex, mutant) -> str:
    """The mutant's edit as a student reads it, about their code."""
    subject = mutant.subject.split("[", 1)[0]  # dz[rows, y] -= ...: the student's dz
    if not subject or subject == "the returned values" or subject.startswith("("):  # a tuple: say the line
        text = f"your code is right except that {mutant.said}"
    else:
        text = f"your {subject} is right except that {mutant.said}"
    if mutant.statement and subject not in ex.outputs:
        text += f" (numformer's line: `{mutant.statement}`)"
    return text


def same_error(ex, mine: list, seed: int = 0, most: int = 4) -> list:
    """The mutants that raise exactly the student's exceptions (type and message) on every case: at most
    ``most`` of them, else none (an error that many edits raise says nothing of which it was; four, since the
    R-op of LayerNorm holds four row means in one statement, and a keepdims dropped from any raises alike)."""
    if not mine or not all(o.raised for o in mine):
        return []
    found = [m for m, theirs in mutant_outcomes(ex, seed)
             if all(t.raised and t.signature == o.signature for o, t in zip(mine, theirs))]
    return found if len(found) <= most else []


def same_error_sentence(ex, found: list) -> str:
    """"your code raises the error numformer's backward raises when ..." for :func:`same_error`'s mutants."""
    whens = [m.said + (f" (in `{m.statement}`)" if m.statement and not m.statement.startswith("return") else "")
             for m in found]
    return "your code raises the error that numformer's backward raises when " + "; or when ".join(whens)


def reproduced(ex, mine: list, reference: list, seed: int = 0):
    """What reproduces ``mine`` on every case: ("mistake", its name) for a catalogued mistake, ("edit", the Mutant)
    for a single edit of numformer's backward, the closest of the first source that has one; or None. A catalogued
    mistake may raise as the student's code does (the same error); an edit must have an output to compare (two
    edits raising the same error say nothing of which it was: :func:`same_error` names those)."""
    found = closest(((m.__name__, run_function(ex, m, seed)[1]) for m in ex.mistakes), mine, reference)
    if found is not None:
        return "mistake", found[0]
    found = closest(mutant_outcomes(ex, seed), mine, reference) if any(o.output for o in mine) else None
    return None if found is None else ("edit", found[0])


def wrong_entries(name: str, got, ref, tiny: float, tolerance: float = 1e-6) -> str:
    """Which entries of one gradient are wrong, as precisely as can be said."""
    bad = relative_errors(got, ref, tiny) > tolerance
    n_bad, size = int(bad.sum()), bad.size
    text = f"{name}: wrong at {n_bad} of {size} entries"
    c = constant_factor(got, ref)
    if c is not None:
        text += f" (numformer's times {c:.6g})"
    if n_bad == size:
        return text + " (every entry)"
    if c is not None:
        return text  # the factor says it: entries where numformer's is zero stay zero, the others are all off
    zero = np.abs(ref) <= tiny * 1e-6
    if zero.any() and np.array_equal(bad, bad & zero):
        return text + ", only where numformer's gradient is zero (masked or padded positions, or a ReLU that is off?)"
    if zero.any() and np.array_equal(bad, ~zero):
        return text + ": right where numformer's gradient is zero, wrong everywhere else"
    places = []
    for axis in range(bad.ndim):
        hit = np.flatnonzero(bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis)))
        if len(hit) < bad.shape[axis]:
            places.append(f"index {', '.join(map(str, hit[:6]))}{' ...' if len(hit) > 6 else ''} of axis {axis}")
    first = [tuple(int(i) for i in idx) for idx in np.argwhere(bad)[:4]]
    text += (", all at " + " and ".join(places) if places else "") + f"; first at {', '.join(map(str, first))}"
    return text
