"""Issue 41: the grader names the first wrong step of a student's backward, checked on students' own mistakes.

Every solution of tests/exercises/student_mistakes.py and student_mistakes_layers.py is written as a student's
file (tests/lab_files.py) and graded as ``python -m grad_checks check`` grades it (``lab.check_file``). It must
be graded wrong (status 1) in a report without a traceback, and by the new diagnosis, not by the catalogue
(``result.mistake is None``: none of them is a catalogued mistake). The diagnosis is read through
``result.steps``, a list of ``WrongStep`` (``name``, the step's math name; ``code``, numformer's source text of
it; ``variable``, the name numformer binds it to, or None; ``line``, the line of the student's file computing
its counterpart, or None; ``factor``; ``pattern``; ``said``, the sentence the report prints), the first one the
first wrong step.

A diagnosis made must be right: a wrong one sends the student to fix a line that is correct, which is worse
than none. So each solution's test checks whatever was diagnosed (the step, the line, the factor, the pattern,
the second mistake, the sentence in the report), and one aggregate test asks that at least 89 in 100
solutions are *located* (the first step named, a line of the student's own route proven by an edit of it
(``own``), or the mistake's line alone said as feeding the wrong values):
issue 61 names a step only when a replay proves it (grad_checks/first_wrong_step.py), and an unproven one is said
as the wrong returned values with the student's lines that feed them, which must hold the mistake's line.
"""
import ast
import inspect
import textwrap
from collections import Counter

import pytest

import lab_files
import student_mistakes
import student_mistakes_layers  # noqa: F401  (its solutions register into student_mistakes.SOLUTIONS)
from grad_checks import exercises, lab

SOLUTIONS = student_mistakes.SOLUTIONS
# issue 67: a line is named only where the value it must hold is known, and two lines that can each absorb the error
# are named together: 32 of the 38 here are located (34 before, two of which named a line that only uses a wrong
# value: the scatter after a lost start 0, the division by counts where counts of 1 would do as well: now named
# with the line of those positions; and the row sum over the queries is now at its own line, not at the line using
# it; the gradient of the probabilities, -q / p, is said with the line of its smoothed target q, which no value
# known confirms); the others get the lines that could hold it, never a right step alone
LOCATED_SHARE = 0.84
AT_LEAST_FOUR = ("attention", "layernorm", "softmax", "loss", "embedding")
PATTERNS = {"masked", "mask reversed", "padding", "repeated ids", "row", "column", "head"}

_GRADES = {}  # solution name -> (path, result, status, message): each file graded once for every test here


def graded(expect, tmp_path_factory):
    name = expect.fn.__name__
    if name not in _GRADES:
        ex = exercises.get(expect.exercise)
        path = lab_files.write(ex, expect.fn, tmp_path_factory.mktemp(name))
        result, status, message = lab.check_file(str(path))
        _GRADES[name] = (path, result, status, message)
    return _GRADES[name]


def names(step, expected) -> bool:
    """Whether a WrongStep names the expected step (its source text, its variable or its math name)."""
    return expected in (step.code, step.variable, step.name)


def proven(result) -> list:
    """The steps the diagnosis names as wrong (issue 61: proven by a replay); the others are the wrong returned
    values with the lines feeding them, said when no step is proven."""
    return [s for s in result.steps if s.proven]


def located(expect, result, path=None) -> bool:
    """The first step named (a line of the student's own route: that line); or, no step proven, the mistake's line
    alone said as the one feeding the wrong values."""
    if proven(result):
        first = proven(result)[0]
        if first.own:
            return path is not None and expect.own_line is not None and \
                first.line == snippet_line(path, exercises.get(expect.exercise), expect.own_line)
        return names(first, expect.step)
    if path is None or expect.line is None or not result.steps:
        return False
    want = snippet_line(path, exercises.get(expect.exercise), expect.line)
    return set().union(*[set(s.lines) for s in result.steps]) == {want}


def snippet_line(path, ex, snippet):
    """The first line (1-based) of the written file, from the student's def on, holding ``snippet``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, text in enumerate(lines) if text.lstrip().startswith(f"def {ex.target.__name__}("))
    found = [i + 1 for i in range(start, len(lines)) if snippet in lines[i]]
    assert found, f"{snippet!r} is not in the student's code as written (ast.unparse spells it differently?)"
    return found[0]


def reference_steps(ex) -> set:
    """Every name a step of numformer's reference may be given: the source text of each of its sub-expressions
    (as ast.get_source_segment gives it), an array it changes in place and each name it binds; and those of the
    helpers of numformer's layers it calls (softmax_backward in attention's), whose values are known too."""
    found = set()
    for fn in [ex.target] + [v for v in vars(inspect.getmodule(ex.target)).values() if inspect.isfunction(v)
                             and v.__module__.startswith("numformer.layers.") and v.__name__ in
                             ex.target.__code__.co_names]:
        source = textwrap.dedent(inspect.getsource(fn))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.expr, ast.AugAssign)):
                found.add(ast.get_source_segment(source, node))
            if isinstance(node, ast.Assign):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def parameters(fn) -> list:
    """Names, kinds and defaults, not annotations: a student's function is not annotated."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_set_covers_the_exercises_and_holds_no_catalogued_mistake(tmp_path_factory):
    assert len(SOLUTIONS) >= 30
    assert len({e.fn.__name__ for e in SOLUTIONS}) == len(SOLUTIONS)
    per_exercise = Counter(e.exercise for e in SOLUTIONS)
    assert len(per_exercise) >= 8, per_exercise
    assert all(per_exercise[name] >= 4 for name in AT_LEAST_FOUR), per_exercise
    for e in SOLUTIONS:
        ex = exercises.get(e.exercise)
        assert e.fn.__name__ not in ex.mistake_names
        assert parameters(e.fn) == parameters(ex.target), e.fn.__name__
        # the expected steps are numformer's own: a name it binds or the text of one of its sub-expressions
        steps = reference_steps(ex)
        assert e.step in steps and (e.second is None or e.second in steps), e.fn.__name__
        assert e.pattern is None or e.pattern in PATTERNS
        # graded by what it computes, no catalogued mistake reproduces it either
        assert graded(e, tmp_path_factory)[1].mistake is None, e.fn.__name__


@pytest.mark.parametrize("expect", SOLUTIONS, ids=lambda e: e.fn.__name__)
def test_a_diagnosed_first_wrong_step_is_the_right_one(expect, tmp_path_factory):
    ex = exercises.get(expect.exercise)
    path, result, status, message = graded(expect, tmp_path_factory)
    assert status == 1 and result is not None, message
    text = str(result)
    assert "Traceback" not in text and "Traceback" not in message
    assert result.mistake is None, result.mistake
    want_line = None if expect.line is None else snippet_line(path, ex, expect.line)
    steps = proven(result)
    assert all(s.said in text for s in result.steps)
    if want_line is not None and not steps and result.steps:  # unproven: the lines said feed it, the mistake's too
        assert any(want_line in s.lines for s in result.steps), (result.steps, expect.line)
    if not steps:
        return  # not located: the aggregate test counts it; saying nothing is not saying something wrong
    first = steps[0]
    if first.own:  # a line of the student's own route, proven by an edit of it: that line, and no step of numformer's
        assert expect.own_line is not None, (first, expect.note)
        assert first.line == snippet_line(path, ex, expect.own_line), (first, expect.own_line)
        return
    assert names(first, expect.step), (first, expect.note)
    assert first.line == want_line, (first, expect.line)
    if expect.factor is not None:
        assert first.factor == expect.factor, first
    if expect.pattern is not None:
        assert first.pattern == expect.pattern, first
    if expect.second is not None:
        assert any(names(s, expect.second) for s in result.steps[1:]), result.steps
    assert all(s.said in text for s in steps)


def test_the_share_is_located(tmp_path_factory):
    missed = [e.fn.__name__ for e in SOLUTIONS
              if not located(e, graded(e, tmp_path_factory)[1], graded(e, tmp_path_factory)[0])]
    assert len(SOLUTIONS) - len(missed) >= LOCATED_SHARE * len(SOLUTIONS), f"not located: {missed}"


def test_a_grader_that_skips_the_intermediates_fails_the_share(monkeypatch, tmp_path):
    """Planted: the grading as it was before the first wrong step (catalogue, single edits,
    entries; no comparison of intermediates) locates none of these; the share test must then fail."""
    import grad_checks.grading as grading
    monkeypatch.setattr(grading, "first_wrong_steps", lambda *args, **kwargs: [])
    found = 0
    for e in SOLUTIONS:
        ex = exercises.get(e.exercise)
        (tmp_path / e.fn.__name__).mkdir()
        path = lab_files.write(ex, e.fn, tmp_path / e.fn.__name__)
        result, status, _ = lab.check_file(str(path), finite_differences=False)
        assert status == 1
        found += located(e, result, path)
    assert found < LOCATED_SHARE * len(SOLUTIONS)
