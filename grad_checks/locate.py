"""Where a wrong backward goes wrong, when no catalogued mistake explains it: the term, or the entries.

The grading (grad_checks/grading.py) first tries the exercise's catalogue of classic mistakes. When
none reproduces the student's gradients, this module tries, in order:

1. **A single edit of numformer's own backward** (grad_checks/mutants.py: a term dropped, a sign
   flipped, a factor or a transpose dropped, operands swapped, a sum made a mean, a reduction over
   the wrong axis, a masking or a child's backward skipped, returned values swapped). A mutant whose
   gradients agree with the student's on every case, to the finite-difference tolerance, locates the
   mistake: "your dx is right except that the term `xhat * ...` enters with a + sign". A student's code
   that raises has no output to compare; when at most three mutants raise the very same error (type and
   message) on every case, they are named: "your code raises the error that numformer's backward raises
   when the product `dy @ w.T` has its operands the other way round; or when ...".
2. **The terms, weighed.** Each additive term of the reference contributes ``reference - (reference
   with the term dropped)`` to the gradients. When the student's gradients are numformer's plus a
   combination of those contributions (least squares over every case and tensor, residual below the
   tolerance), the terms with weight 1 are right and the others are named with the weight they have
   ("enters 2 times", "enters with the opposite sign", "is missing"): two mistakes at once are located.
3. **The entries.** Otherwise, for each gradient: right or wrong, and for a wrong one how many entries,
   which (all in one row or column; only where numformer's is zero, i.e. masked or padded positions;
   the first few indices).

The mutants' gradients are computed once per exercise and seed and kept (``_OUTCOMES``): grading many
answers, or every mutant (``python -m grad_checks mutants``), runs each mutant once.
"""
from __future__ import annotations

import numpy as np

from .candidates import closest, constant_factor, relative_errors, run_function
from .mutants import mutants

TERM_DROPPED = "term `"  # the mutants.py edit "term `x` dropped": that term's contribution


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


def same_error(ex, mine: list, seed: int = 0, most: int = 3) -> list:
    """The mutants that raise exactly the student's exceptions (type and message) on every case: at most
    ``most`` of them, else none (an error that many edits raise says nothing of which it was)."""
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


def single_edit(ex, mine: list, reference: list, seed: int = 0):
    """The mutant that reproduces ``mine`` on every case (the closest, if several), or None; ``mine`` must have
    an output on some case (an exception is not one: two edits raising the same error say nothing of which it
    was; :func:`same_error` names those)."""
    if not any(o.output for o in mine):
        return None
    found = closest(mutant_outcomes(ex, seed), mine, reference)
    return found[0] if found is not None else None


def _stack(outcomes, names) -> np.ndarray:
    return np.concatenate([o.grads[n].ravel() for o, case_names in zip(outcomes, names) for n in case_names])


def weighed_terms(ex, mine: list, reference: list, seed: int = 0, tolerance: float = 1e-6):
    """``[(term, weight)]`` when the student's gradients are numformer's with its additive terms weighed
    differently (every term listed, 1.0 = as numformer has it), else None."""
    if any(o.grads is None for o in mine + reference):
        return None
    names = [sorted(r.grads) for r in reference]
    if any(sorted(m.grads) != n for m, n in zip(mine, names)):
        return None
    ref = _stack(reference, names)
    diff = _stack(mine, names) - ref
    terms, columns = [], []
    for mutant, theirs in mutant_outcomes(ex, seed):
        if not mutant.edit.startswith(TERM_DROPPED) or any(o.grads is None for o in theirs):
            continue
        if any(sorted(o.grads) != n for o, n in zip(theirs, names)):
            continue
        term = mutant.edit[len(TERM_DROPPED):].rsplit("` dropped", 1)[0]
        column = ref - _stack(theirs, names)
        if not np.any(column) or term in terms:
            continue
        terms.append(term)
        columns.append(column)
    if not terms:
        return None
    # independent terms only, the smallest first: a term that holds others (`a - b`) is the sum of their columns
    keep, basis = [], np.zeros((len(ref), 0))
    for i in sorted(range(len(terms)), key=lambda i: len(terms[i])):
        if basis.shape[1]:
            fit, *_ = np.linalg.lstsq(basis, columns[i], rcond=None)
            if np.linalg.norm(basis @ fit - columns[i]) <= 1e-9 * np.linalg.norm(columns[i]):
                continue
        keep.append(i)
        basis = np.concatenate([basis, columns[i][:, None]], axis=1)
    terms, matrix = [terms[i] for i in keep], basis
    weights, *_ = np.linalg.lstsq(matrix, diff, rcond=None)
    residual = np.linalg.norm(matrix @ weights - diff)
    if residual > tolerance * max(np.linalg.norm(ref), 1e-30) or np.linalg.norm(diff) == 0:
        return None
    weights = np.round(1.0 + weights, 6)
    if np.all(np.abs(weights - 1.0) <= 1e-3):  # numformer's to rounding: a precision problem, not a term
        return None
    if len(weights) > 1 and np.all(weights == weights[0]):  # every term alike: a factor, said as one
        return None
    return [(t, float(w)) for t, w in zip(terms, weights)]


def weighed_sentence(weighed) -> str:
    """"your gradients are numformer's except that the term `b` enters 2 times; the terms `a`, `c` are right"."""
    def how(w):
        if w == 0:
            return "is missing"
        if w == -1:
            return "enters with the opposite sign"
        return f"enters {w:g} times (numformer's: once)"
    wrong = [f"the term `{t}` {how(w)}" for t, w in weighed if abs(w - 1.0) > 1e-6]
    right = [f"`{t}`" for t, w in weighed if abs(w - 1.0) <= 1e-6]
    text = "your gradients are numformer's except that " + " and ".join(wrong)
    if right:
        text += f"; the term{'s' if len(right) > 1 else ''} {', '.join(right)} {'are' if len(right) > 1 else 'is'} right"
    return text


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
