"""Single-edit mutants of each exercise's reference solution: the edits a student makes by accident.

This module edits the source of each exercise's reference (numformer's own backward, as it is now)
one small change at a time, and compiles each *mutant*; each carries its edit in two wordings, as
made to numformer's code and as a student reads it about theirs:

* a term dropped: ``a + b`` -> ``a`` or ``b``; ``a - b`` -> ``a`` or ``-b``
* a sign flipped: ``+`` <-> ``-``, ``+=`` <-> ``-=``, a unary minus removed
* a factor dropped: ``a * b`` -> ``a`` or ``b``; ``a / b`` -> ``a``
* a transpose dropped: ``x.T`` -> ``x``; ``x.swapaxes(...)`` / ``x.transpose(...)`` -> ``x``
* operands swapped: ``a @ b`` -> ``b @ a``; ``matmul(a, b)`` -> ``matmul(b, a)``
* a reduction changed: ``.sum(...)`` <-> ``.mean(...)``
* a reduction moved: ``axis=0`` <-> ``axis=-1`` (the rows against the features)
* a masking dropped: ``where(mask, a, b)`` -> ``b``
* a reduction's ``keepdims=True`` dropped (the result no longer broadcasts along its row)
* a backward skipped: ``child.backward(g)`` or ``softmax_backward(g, y)`` -> ``g``
* two returned values swapped: ``return a, b`` -> ``return b, a``

Each mutant is compiled in its reference's module (same globals, file and lines). grad_checks/mutation_testing.py
grades them (``python -m grad_checks mutants``); grad_checks/locate.py uses them to locate a
student's mistake to the term. Some edits change nothing mathematically (an equivalent mutant): each
exercise's ``equivalent`` names them, with the reason; :func:`equivalent` (``EQUIVALENT``) gathers them.
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from dataclasses import dataclass


TRANSPOSES = ("swapaxes", "transpose")


@dataclass
class Mutant:
    exercise: str
    line: int           # line in the reference's file
    edit: str           # what was changed, in words
    source: str         # the mutated function
    function: object
    said: str = ""      # the mistake as a student reads it: "the term `b` enters with a + sign (...)"
    subject: str = ""   # what the edited statement computes: "dx", "dxhat", "the returned values", ""
    statement: str = ""  # numformer's statement the edit is in, as code


def _statement(fn_def, node):
    """The innermost statement of ``fn_def`` that holds ``node`` (by position)."""
    best = None
    for stmt in ast.walk(fn_def):
        if isinstance(stmt, ast.stmt) and stmt is not fn_def and stmt.lineno <= node.lineno <= stmt.end_lineno \
                and (stmt.lineno, stmt.col_offset) <= (node.lineno, node.col_offset):
            if best is None or (stmt.end_lineno - stmt.lineno) <= (best.end_lineno - best.lineno):
                best = stmt
    return best


def _subject(stmt, node, outputs) -> str:
    """What ``stmt`` computes, as the student names it: the assigned name, the returned output that holds
    ``node`` (``outputs``: the exercise's names of the returned values), or "" when it is a bare call."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple):
            for t, v in zip(target.elts, stmt.value.elts):
                if any(n is node for n in ast.walk(v)):
                    return ast.unparse(t)
        return ast.unparse(target)
    if isinstance(stmt, ast.AugAssign):
        return ast.unparse(stmt.target)
    if isinstance(stmt, ast.Return) and stmt.value is not None:
        elts = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
        if node is stmt:
            return "the returned values"
        for i, v in enumerate(elts):
            if any(n is node for n in ast.walk(v)):
                return outputs[i] if i < len(outputs) else "the returned value" if len(elts) == 1 \
                    else f"returned value {i + 1}"
    return ""


def _text(node, limit: int = 50) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _axis(node):
    """The int a reduction's axis is given as (``axis=-1``, ``sum(0)``), and where: ("kw", i) or ("arg", 0)."""
    for i, kw in enumerate(node.keywords):
        if kw.arg == "axis":
            value = kw.value
            break
    else:
        if not node.args:
            return None
        value, i = node.args[0], None
    try:
        axis = ast.literal_eval(value)
    except ValueError:
        return None
    return (axis, ("kw", i) if i is not None else ("arg", 0)) if isinstance(axis, int) else None


AXES = (0, -1)  # a reduction moved between the rows (axis 0) and the features (the last axis): the classic mix-up


def _edits(node) -> list:
    """(description, replacement node, what a student reads) for every mutation of ``node`` itself.

    The description names the edit as made to numformer's code (``mutants`` lists it); what a student reads
    completes "your dx is right except that ...", the mistake seen from their side."""
    out = []
    if isinstance(node, ast.BinOp):
        left, right = node.left, node.right
        if isinstance(node.op, (ast.Add, ast.Sub)):
            out.append((f"term `{_text(right)}` dropped", left, f"the term `{_text(right)}` is missing"))
            out.append((f"term `{_text(left)}` dropped",
                        right if isinstance(node.op, ast.Add) else ast.UnaryOp(ast.USub(), right),
                        f"the term `{_text(left)}` is missing"))
            flipped = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
            sign, was = ("-", "added") if isinstance(node.op, ast.Add) else ("+", "subtracted")
            out.append((f"sign of `{_text(right)}` flipped", ast.BinOp(left, flipped, right),
                        f"the term `{_text(right)}` enters with a {sign} sign (it is {was})"))
        elif isinstance(node.op, ast.Mult):
            out.append((f"factor `{_text(right)}` dropped", left,
                        f"the factor `{_text(right)}` is missing from `{_text(node)}`"))
            out.append((f"factor `{_text(left)}` dropped", right,
                        f"the factor `{_text(left)}` is missing from `{_text(node)}`"))
        elif isinstance(node.op, ast.Div):
            out.append((f"divisor `{_text(right)}` dropped", left,
                        f"`{_text(node)}` is not divided by `{_text(right)}`"))
        elif isinstance(node.op, ast.MatMult):
            out.append((f"operands of `{_text(node)}` swapped", ast.BinOp(right, ast.MatMult(), left),
                        f"the product `{_text(node)}` has its operands the other way round"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        said = f"`{_text(node.operand)}` stands where `{_text(node)}` belongs (the minus sign is missing)" \
            if isinstance(node.operand, ast.Constant) else f"the minus sign of `{_text(node)}` is missing"
        out.append((f"minus of `{_text(node)}` dropped", node.operand, said))
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
        flipped = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        does, should = ("subtracts", "add") if isinstance(node.op, ast.Add) else ("adds", "subtract")
        out.append((f"`{_text(node)}` with its sign flipped", ast.AugAssign(node.target, flipped, node.value),
                    f"it {does} `{_text(node.value)}` where `{_text(node)}` should {should} it"))
    elif isinstance(node, ast.Attribute) and node.attr == "T":
        out.append((f"transpose of `{_text(node)}` dropped", node.value,
                    f"it uses `{_text(node.value)}` where its transpose `{_text(node)}` belongs"))
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if isinstance(func, ast.Attribute) and name in TRANSPOSES:
            out.append((f"transpose of `{_text(node)}` dropped", func.value,
                        f"it uses `{_text(func.value)}` where the transpose `{_text(node)}` belongs"))
        if isinstance(func, ast.Attribute) and name in ("sum", "mean"):
            other = "mean" if name == "sum" else "sum"
            new = copy.deepcopy(node)
            new.func.attr = other
            extra = "missing" if name == "sum" else "too many"
            out.append((f"`{_text(node)}` became a {other}", new,
                        f"`{_text(node)}` takes a {other} where it should take a {name} (a factor of the axis' "
                        f"length {extra})"))
            found = _axis(node)
            if found is not None:
                axis, (how, i) = found
                for other_axis in AXES:
                    if other_axis == axis:
                        continue
                    new = copy.deepcopy(node)
                    value = ast.parse(str(other_axis), mode="eval").body
                    if how == "kw":
                        new.keywords[i].value = value
                    else:
                        new.args[0] = value
                    out.append((f"axis of `{_text(node)}` became {other_axis}", new,
                                f"`{_text(node)}` reduces over axis {other_axis} where it should reduce over axis "
                                f"{axis}"))
        if name == "matmul" and len(node.args) == 2:
            new = copy.deepcopy(node)
            new.args = [new.args[1], new.args[0]]
            out.append((f"operands of `{_text(node)}` swapped", new,
                        f"the product `{_text(node)}` has its operands the other way round"))
        if name == "where" and len(node.args) == 3:
            out.append((f"masking `{_text(node)}` dropped", node.args[2],
                        f"the masking `{_text(node)}` is missing (the masked entries get a gradient)"))
        if name.endswith("backward") and node.args:
            out.append((f"`{_text(node)}` skipped (its gradient passed through)", node.args[0],
                        f"`{_text(node)}` is skipped: the gradient passes through without that backward"))
        for i, kw in enumerate(node.keywords):
            if kw.arg == "keepdims":
                new = copy.deepcopy(node)
                del new.keywords[i]
                out.append((f"keepdims of `{_text(node)}` dropped", new,
                            f"`{_text(node)}` lacks keepdims=True, so it no longer broadcasts along its row"))
    elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) >= 2:
        for i in range(len(node.value.elts) - 1):
            elts = list(node.value.elts)
            elts[i], elts[i + 1] = elts[i + 1], elts[i]
            out.append((f"returned `{_text(elts[i + 1])}` and `{_text(elts[i])}` swapped",
                        ast.Return(ast.Tuple(elts, ast.Load())),
                        f"`{_text(elts[i + 1])}` and `{_text(elts[i])}` are returned in each other's place"))
    return out


def _nodes(fdef):
    """Every node of the function's body in the order written (a statement before what it holds), docstring left out."""
    body = fdef.body
    stack = list(reversed(body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                          else body))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def replaced(source: str, node, new) -> str:
    """``source`` with ``node``'s text replaced by ``new``'s, every other line where it was (the one mechanism of
    an edit: a mutant of numformer's code, a fix suggested for a student's, grad_checks/own_route.py)."""
    lines = source.splitlines(keepends=True)
    start, end = node.lineno - 1, node.end_lineno - 1
    head = lines[start].encode()[:node.col_offset].decode()
    tail = lines[end].encode()[node.end_col_offset:].decode()
    text = ast.unparse(new)
    if isinstance(node, ast.expr):
        text = f"({text}{chr(10) * (end - start)})"  # parenthesised: it binds as the node did, over as many lines
    else:
        text += "\n" * (end - start)
    return "".join(lines[:start]) + head + text + tail + "".join(lines[end + 1:])


def mutants(ex) -> list:
    """Every single-edit mutant of ``ex``'s reference, compiled in the reference's module at its lines."""
    from .recorded_run import rewritten  # noqa: PLC0415  (the recording's compiler, which keeps file and lines)

    source = textwrap.dedent(inspect.getsource(ex.target))
    first, fdef = inspect.getsourcelines(ex.target)[1], ast.parse(source).body[0]
    found = []
    for node in (n for n in _nodes(fdef) if hasattr(n, "lineno")):
        stmt = _statement(fdef, node)
        subject, statement = (_subject(stmt, node, ex.outputs), _text(stmt, 80)) if stmt is not None else ("", "")
        for edit, new, said in _edits(node):
            text = replaced(source, node, new)
            fn = rewritten(ex.target, text)
            if fn is not None:
                found.append(Mutant(ex.name, first + node.lineno - 1, edit, text, fn, said, subject, statement))
    return found


def equivalent() -> dict:
    """The mutants the grading cannot catch because they compute the same thing, each with the reason, keyed by
    (exercise, edit): every exercise's own ``equivalent`` (its file says which edits of its reference change
    nothing, and why). tests/exercises/test_exercise_mutants.py checks that these, and only these, survive."""
    from . import exercises  # noqa: PLC0415  (the exercises' files read this module's neighbours)

    return {(ex.name, edit): why for ex in exercises.all_exercises() for edit, why in ex.equivalent.items()}


def __getattr__(name):
    """``EQUIVALENT``: :func:`equivalent`, gathered from the exercises when first asked for."""
    if name == "EQUIVALENT":
        return equivalent()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
