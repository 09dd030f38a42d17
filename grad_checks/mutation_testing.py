"""Mutation testing of the grading (``python -m grad_checks mutants``): every single-edit mutant of every
exercise's reference (grad_checks/mutants.py) graded as if a student had written it.

A grading that calls every answer right proves nothing. Each mutant is graded on the exercise's cases
against numformer's backward (no finite differences: a mutant is caught when any tensor of any case is
*wrong* or the code fails), with the diagnosis a student would get: a catalogued mistake named, or the
mistake located to the term (grad_checks/locate.py). A mutant the grading calls exact is listed with its
edit and, when it is a known equivalent (:data:`grad_checks.mutants.EQUIVALENT`), the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import exercises
from .grading import grade
from .mutants import EQUIVALENT, Mutant, mutants


@dataclass
class MutantResult:
    mutant: Mutant
    verdict: str        # "wrong", "error", "approximate" or "exact"
    mistake: str | None  # the catalogued mistake it was diagnosed as, if any
    detail: str
    location: str | None = None  # else the mistake located to a term (grad_checks/locate.py), if it was
    raised: bool = False  # it raised an exception (not a refused output) on every case


def grade_mutants(names=None) -> list:
    """Grade every mutant of the named exercises (all by default)."""
    results = []
    for ex in ([exercises.get(n) for n in names] if names else exercises.all_exercises()):
        for m in mutants(ex):
            g = grade(ex, m.function, finite_differences=False, diagnose=True)
            if g.errors or g.not_implemented:
                verdict = "error"
            elif any(t.verdict == "wrong" for t in g.tensors):
                verdict = "wrong"
            elif g.exact:
                verdict = "exact"
            else:
                verdict = "approximate"
            results.append(MutantResult(m, verdict, g.mistake, g.summary(), g.location, g.raised))
    return results


def main(names=None, verbose: bool = False) -> int:
    results = grade_mutants(names)
    caught = [r for r in results if r.verdict in ("wrong", "error")]
    survived = [r for r in results if r not in caught]
    for r in results if verbose else survived:
        m = r.mutant
        why = EQUIVALENT.get((m.exercise, m.edit))
        print(f"{r.verdict:<11} {m.exercise:<14} line {m.line:>4}: {m.edit}"
              + (f"  [mistake {r.mistake}]" if r.mistake else "")
              + (f"\n{'':<12}diagnosis: {r.location}" if r.location and verbose else "")
              + (f"\n{'':<12}equivalent: {why}" if why else ""))
    named = sum(r.mistake is not None for r in caught)
    located = sum(r.mistake is None and r.location is not None for r in caught)
    raised = sum(r.mistake is None and r.location is not None and r.raised for r in caught)
    print(f"{len(caught)} of {len(results)} mutants caught ({sum(r.verdict == 'wrong' for r in caught)} wrong, "
          f"{sum(r.verdict == 'error' for r in caught)} failing); of the caught, {named} diagnosed as a catalogued "
          f"mistake, {located} located to the term ({raised} of them raising an exception, named by the edits "
          f"that raise the same error), {len(caught) - named - located} neither; {len(survived)} "
          f"not caught, {sum((r.mutant.exercise, r.mutant.edit) in EQUIVALENT for r in survived)} of them known "
          "equivalents")
    unexplained = [r for r in survived if (r.mutant.exercise, r.mutant.edit) not in EQUIVALENT]
    return 1 if unexplained else 0
