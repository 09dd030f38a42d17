"""Mutation testing of the grading: small edits of each reference solution must be reported wrong.

A grading that calls every answer right proves nothing. This module edits the source of each
exercise's reference (numformer's own backward, as it is now) one small change at a time, the
edits a student makes by accident, and grades each *mutant* as if a student had written it:

* a term dropped: ``a + b`` -> ``a`` or ``b``; ``a - b`` -> ``a`` or ``-b``
* a sign flipped: ``+`` <-> ``-``, ``+=`` <-> ``-=``, a unary minus removed
* a factor dropped: ``a * b`` -> ``a`` or ``b``; ``a / b`` -> ``a``
* a transpose dropped: ``x.T`` -> ``x``; ``x.swapaxes(...)`` / ``x.transpose(...)`` -> ``x``
* operands swapped: ``a @ b`` -> ``b @ a``; ``matmul(a, b)`` -> ``matmul(b, a)``
* a reduction changed: ``.sum(...)`` <-> ``.mean(...)``
* a masking dropped: ``where(mask, a, b)`` -> ``b``
* a reduction's ``keepdims=True`` dropped (the result no longer broadcasts along its row)
* a backward skipped: ``child.backward(g)`` or ``softmax_backward(g, y)`` -> ``g``
* two returned values swapped: ``return a, b`` -> ``return b, a``

Each mutant is compiled in its reference's module (same globals) and graded on the exercise's
cases against numformer's backward (no finite differences: a mutant is caught when any tensor of
any case is *wrong* or the code fails). A mutant the grading calls exact is listed with its edit:
some edits change nothing mathematically (an equivalent mutant), and the listing says why.
"""
from __future__ import annotations

import ast
import copy
import inspect
import sys
import textwrap
from dataclasses import dataclass

from . import exercises

TRANSPOSES = ("swapaxes", "transpose")


@dataclass
class Mutant:
    exercise: str
    line: int           # line in the reference's file
    edit: str           # what was changed, in words
    source: str         # the mutated function
    function: object


def _text(node, limit: int = 50) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _edits(node) -> list:
    """(description, replacement node) for every mutation of ``node`` itself."""
    out = []
    if isinstance(node, ast.BinOp):
        left, right = node.left, node.right
        if isinstance(node.op, (ast.Add, ast.Sub)):
            out.append((f"term `{_text(right)}` dropped", left))
            out.append((f"term `{_text(left)}` dropped",
                        right if isinstance(node.op, ast.Add) else ast.UnaryOp(ast.USub(), right)))
            flipped = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
            out.append((f"sign of `{_text(right)}` flipped", ast.BinOp(left, flipped, right)))
        elif isinstance(node.op, ast.Mult):
            out.append((f"factor `{_text(right)}` dropped", left))
            out.append((f"factor `{_text(left)}` dropped", right))
        elif isinstance(node.op, ast.Div):
            out.append((f"divisor `{_text(right)}` dropped", left))
        elif isinstance(node.op, ast.MatMult):
            out.append((f"operands of `{_text(node)}` swapped", ast.BinOp(right, ast.MatMult(), left)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        out.append((f"minus of `{_text(node)}` dropped", node.operand))
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
        flipped = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        out.append((f"`{_text(node)}` with its sign flipped", ast.AugAssign(node.target, flipped, node.value)))
    elif isinstance(node, ast.Attribute) and node.attr == "T":
        out.append((f"transpose of `{_text(node)}` dropped", node.value))
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if isinstance(func, ast.Attribute) and name in TRANSPOSES:
            out.append((f"transpose of `{_text(node)}` dropped", func.value))
        if isinstance(func, ast.Attribute) and name in ("sum", "mean"):
            other = "mean" if name == "sum" else "sum"
            new = copy.deepcopy(node)
            new.func.attr = other
            out.append((f"`{_text(node)}` became a {other}", new))
        if name == "matmul" and len(node.args) == 2:
            new = copy.deepcopy(node)
            new.args = [new.args[1], new.args[0]]
            out.append((f"operands of `{_text(node)}` swapped", new))
        if name == "where" and len(node.args) == 3:
            out.append((f"masking `{_text(node)}` dropped", node.args[2]))
        if name.endswith("backward") and node.args:
            out.append((f"`{_text(node)}` skipped (its gradient passed through)", node.args[0]))
        for i, kw in enumerate(node.keywords):
            if kw.arg == "keepdims":
                new = copy.deepcopy(node)
                del new.keywords[i]
                out.append((f"keepdims of `{_text(node)}` dropped", new))
    elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) >= 2:
        for i in range(len(node.value.elts) - 1):
            elts = list(node.value.elts)
            elts[i], elts[i + 1] = elts[i + 1], elts[i]
            out.append((f"returned `{_text(elts[i + 1])}` and `{_text(elts[i])}` swapped",
                        ast.Return(ast.Tuple(elts, ast.Load()))))
    return out


def _sites(fn_def):
    """(parent, field, index or None, node) for every node of the function body, docstring left out."""
    body = fn_def.body
    start = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    stack = [(fn_def, "body", i, stmt) for i, stmt in reversed(list(enumerate(body))) if i >= start]
    while stack:
        parent, fieldname, index, node = stack.pop()
        yield parent, fieldname, index, node
        children = []
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                children += [(node, name, i, v) for i, v in enumerate(value) if isinstance(v, ast.AST)]
            elif isinstance(value, ast.AST):
                children.append((node, name, None, value))
        stack.extend(reversed(children))


def mutants(ex) -> list:
    """Every single-edit mutant of ``ex``'s reference, compiled in the reference's module."""
    target = ex.target
    source = textwrap.dedent(inspect.getsource(target))
    first_line = inspect.getsourcelines(target)[1]
    module = sys.modules[target.__module__]
    n_sites = len(list(_sites(ast.parse(source).body[0])))
    found = []
    for k in range(n_sites):
        probe = ast.parse(source).body[0]
        parent, fieldname, index, node = list(_sites(probe))[k]
        for j in range(len(_edits(node))):
            tree = ast.parse(source)
            parent, fieldname, index, node = list(_sites(tree.body[0]))[k]
            edit, new = _edits(node)[j]
            new = ast.copy_location(new, node)
            if index is None:
                setattr(parent, fieldname, new)
            else:
                getattr(parent, fieldname)[index] = new
            ast.fix_missing_locations(tree)
            namespace = dict(vars(module))
            exec(compile(tree, f"<mutant of {target.__qualname__}>", "exec"), namespace)  # noqa: S102
            found.append(Mutant(ex.name, first_line + node.lineno - 1, edit, ast.unparse(tree),
                                namespace[target.__name__]))
    return found


# Mutants the grading cannot catch because they compute the same thing; each with the reason.
# Keyed by (exercise, edit). tests/exercises/test_exercise_mutants.py checks that these, and only these, survive.
EQUIVALENT = {
    ("layernorm", "minus of `-1` dropped"):
        "mean(axis=1) is mean(axis=-1): the layer hands layernorm_backward 2-d (n, d) rows, whose axis 1 is the "
        "last one",
    ("attention", "minus of `-2` dropped"):
        "swapaxes(-1, 2) is swapaxes(-1, -2): attention's arrays are 4-d (B, h, T, d), whose axis 2 is axis -2",
}


@dataclass
class MutantResult:
    mutant: Mutant
    verdict: str        # "wrong", "error", "approximate" or "exact"
    mistake: str | None  # the catalogued mistake it was diagnosed as, if any
    detail: str


def grade_mutants(names=None) -> list:
    """Grade every mutant of the named exercises (all by default)."""
    from .grading import grade  # noqa: PLC0415

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
            results.append(MutantResult(m, verdict, g.mistake, g.summary()))
    return results


def main(names=None, verbose: bool = False) -> int:
    results = grade_mutants(names)
    caught = [r for r in results if r.verdict in ("wrong", "error")]
    survived = [r for r in results if r not in caught]
    for r in results if verbose else survived:
        m = r.mutant
        why = EQUIVALENT.get((m.exercise, m.edit))
        print(f"{r.verdict:<11} {m.exercise:<14} line {m.line:>4}: {m.edit}"
              + (f"  [mistake {r.mistake}]" if r.mistake else "") + (f"\n{'':<12}equivalent: {why}" if why else ""))
    named = sum(r.mistake is not None for r in caught)
    print(f"{len(caught)} of {len(results)} mutants caught ({sum(r.verdict == 'wrong' for r in caught)} wrong, "
          f"{sum(r.verdict == 'error' for r in caught)} failing); {named} of the caught diagnosed as a catalogued "
          f"mistake; {len(survived)} not caught, {sum((r.mutant.exercise, r.mutant.edit) in EQUIVALENT for r in survived)}"
          " of them known equivalents")
    unexplained = [r for r in survived if (r.mutant.exercise, r.mutant.edit) not in EQUIVALENT]
    return 1 if unexplained else 0
