"""Mutation testing of the grading (grad_checks/mutants.py): every single-edit mutant of every exercise's
reference solution (grad_checks/mutants.py, graded by grad_checks/mutation_testing.py: a term dropped, a sign flipped, a factor or a transpose dropped, operands swapped, a sum
made a mean, a reduction over the wrong axis, a masking or a child's backward skipped, returned values swapped)
is reported wrong or failing, except the listed equivalent mutants, which compute the same thing; and every
caught mutant is either named by the exercise's catalogue or located to the edited term, in words a student
reads (grad_checks/locate.py); docs/exercises.md states both figures."""
import re
from collections import Counter
from pathlib import Path

from grad_checks import exercises
from grad_checks.grading import grade
from grad_checks.mutants import EQUIVALENT, mutants
from grad_checks.mutation_testing import grade_mutants

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


# Mutants of the activation exercises whose edit the locator says another way that computes the same function:
# dropping either x of `x * x` leaves `x`; dropping the term `3 * K * x * x` of `1 + 3 * K * x * x` leaves the factor
# 1, as dropping that factor does; dropping `gate` from `1 - gate` leaves 1, as dropping the factor `1 - gate` does.
SAME_EDIT = {  # (exercise, what the mutant's edit says) -> the same edit as the locator says it
    ("gelu", "the factor `x` is missing from `-0.5 * x`"): "the factor `x` is missing from `-0.5 * x * x`",
    ("gelu_tanh", "the factor `x` is missing from `3 * K * x`"): "the factor `x` is missing from `3 * K * x * x`",
    ("gelu_tanh", "the term `3 * K * x * x` is missing"): "the factor `1 + 3 * K * x * x` is missing",
    ("gelu_tanh", "the term `gate` is missing"): "the factor `1 - gate` is missing",
}


def test_every_caught_mutant_is_named_by_the_catalogue_or_located_to_its_term():
    results = grade_mutants()
    caught = [r for r in results if r.verdict in ("wrong", "error")]
    unexplained = [(r.mutant.exercise, r.mutant.edit, r.detail) for r in caught
                   if r.mistake is None and r.location is None]
    assert not unexplained
    located = [r for r in caught if r.mistake is None]
    # the location names the edit that was made, as the student reads it ("the term `b` enters with a + sign"),
    # or one of the same function said another way (SAME_EDIT)
    def names_the_edit(r) -> bool:
        return r.mutant.said in r.location or SAME_EDIT.get((r.mutant.exercise, r.mutant.said), "\0") in r.location
    assert all(names_the_edit(r) for r in located), [(r.mutant.edit, r.location) for r in located
                                                      if not names_the_edit(r)]
    per_exercise = Counter(r.mutant.exercise for r in located)
    assert set(per_exercise) <= set(exercises.ORDER) and len(per_exercise) >= 10
    named = len(caught) - len(located)
    figure = re.search(r"(\d+) named by their catalogue and (\d+) located to the term", DOC.read_text())
    assert figure and (int(figure[1]), int(figure[2])) == (named, len(located)), \
        f"exercises.md should say {named} named by their catalogue and {len(located)} located to the term"


def test_a_located_mistake_reads_as_the_student_made_it():
    def flipped(dy, xhat, r, gamma):  # the mutant "sign of `xhat * ...` flipped", written by hand
        dxhat = dy * gamma
        dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) + xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
        return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)

    result = grade(exercises.get("layernorm"), flipped)
    assert result.mistake is None
    assert result.location == ("your dx is right except that the term `xhat * (dxhat * xhat).mean(axis=-1, "
                               "keepdims=True)` enters with a + sign (it is subtracted) (wrong as a result: input:x; "
                               "right: weight, bias)")
    assert "diagnosis: your dx is right except" in str(result) and "mistake located" in result.summary()


def test_the_mutation_operators_each_fire():
    edits = [m.edit for name in exercises.ORDER for m in mutants(exercises.get(name))]
    for kind in ("term `", "sign of `", "factor `", "transpose of `", "operands of `", "became a mean",
                 "became a sum", "masking `", "skipped (its gradient passed through)", "swapped", "keepdims of `",
                 "with its sign flipped", "divisor `", "became 0", "became -1"):
        assert any(kind in e for e in edits), kind
