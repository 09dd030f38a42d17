"""Mutation testing of the grading (grad_checks/mutants.py): every single-edit mutant of every exercise's
reference solution (a term dropped, a sign flipped, a factor or a transpose dropped, operands swapped, a sum
made a mean, a masking or a child's backward skipped, returned values swapped) is reported wrong or failing,
except the listed equivalent mutants, which compute the same thing; docs/exercises.md states the same figure."""
import re
from collections import Counter
from pathlib import Path

from grad_checks import exercises
from grad_checks.mutants import EQUIVALENT, grade_mutants, mutants

DOC = Path(__file__).resolve().parents[2] / "docs" / "exercises.md"


def test_every_mutant_is_caught_or_a_listed_equivalent():
    results = grade_mutants()
    assert set(Counter(r.mutant.exercise for r in results)) == set(exercises.ORDER)  # every reference mutated
    survivors = [r for r in results if r.verdict not in ("wrong", "error")]
    assert {(r.mutant.exercise, r.mutant.edit) for r in survivors} == set(EQUIVALENT), \
        [(r.mutant.exercise, r.mutant.line, r.mutant.edit, r.verdict) for r in survivors]
    assert all(r.verdict == "exact" for r in survivors)  # equivalent mutants: nothing "approximate" slips through
    caught = len(results) - len(survivors)
    for page in (DOC, DOC.parents[1] / "README.md"):
        figure = re.search(r"(\d+) of (\d+) (?:single-edit )?mutants", page.read_text())
        assert figure and (int(figure[1]), int(figure[2])) == (caught, len(results)), \
            f"{page.name} should say {caught} of {len(results)} mutants"


def test_the_mutation_operators_each_fire():
    edits = [m.edit for name in exercises.ORDER for m in mutants(exercises.get(name))]
    for kind in ("term `", "sign of `", "factor `", "transpose of `", "operands of `", "became a mean",
                 "became a sum", "masking `", "skipped (its gradient passed through)", "swapped", "keepdims of `",
                 "with its sign flipped", "divisor `"):
        assert any(kind in e for e in edits), kind
