"""A route of the student's own, located at its line (issue 61, item 2): one edit of the student's code puts it right.

A student's backward may take a route numformer's does not: LayerNorm through dvar and dmu (the textbook's route)
where numformer's has a closed form, a softmax through its Jacobian. Its values there are none of numformer's, so
neither proof of grad_checks/first_wrong_step.py applies (each needs a value of numformer's in the student's step's
place), and the grading said only the wrong entries and the lines feeding them. Here the student's own code is the
reference of its own route: each of the student's lines that feeds a wrong returned value, and computes a value
numformer's code does not (the lines the unproven sentence names), is edited, one small edit at a time, and the
student's code is run with that edit on every case:

* the edits of grad_checks/mutants.py, which undo the same slips: a sign flipped, a term or a factor dropped (one too
  many), a transpose dropped, a sum for a mean, an axis moved, a masking dropped, keepdims dropped;
* a number in the arithmetic changed: -c, c + 1, c - 1, 2c, c / 2 (a power off by one, a sign, a factor of two);
* a factor put on the term beside it too: ``a * b - c`` -> ``(a - c) * b`` or ``a * (b - c)``, ``a / b + c`` ->
  ``(a + c) / b`` (a gain, a weight or 1/std applied to one term where it belongs to the sum).

An edit after which every gradient of every case is right (to the grading's tolerance) is the proof: the edited
code is a right route, and the student's computes the same values as it up to that line and first differs there.
The line is named only when every such edit is on it: when edits of two lines each put the answer right (one may
merely compensate the other's mistake: ``-0.5`` for ``0.5`` in dvar, or ``-2.0`` for ``2.0`` where dvar is used),
neither is, and the unproven sentence stands. The sentence gives the edit and how the student's value at the line
differs from the edited code's there: the value that makes the student's route right.

Why edits and not a value fitted at the line (a value at line L solved for so that the student's later lines return
numformer's gradients): values alone cannot tell which factor of a product is wrong. The variance route's
``dvar = (dxhat * xmu).sum(...) * -0.5 * var_eps ** (-0.5)`` is put right by a value fitted at its first factor as
well as at its second (each times (var + eps)^-1, row by row), and by one fitted at ``var_eps`` itself (cubed): a
fit proves only that the mistake is at that line or at a line whose value it can absorb, and the first such line
along the data flow is ``var_eps = 1.0 / r ** 2``, which is right. An edit changes code, not a value: with
``var_eps ** (-1.5)`` the route is right, and no one edit of ``var_eps = 1.0 / r ** 2`` makes it so.

Every run counts against the diagnosis' budget (grad_checks/first_wrong_step.py's :data:`SEARCH_BUDGET`).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

import numpy as np

from .candidates import relative_errors
from .counterparts import factor
from .mutants import _edits
from .recorded_run import Recorder, recorded, rewritten


@dataclass
class Repair:
    """One edit of the student's line that makes every gradient right, and how the line's value changes with it."""

    line: int           # the line of the student's file
    statement: str      # its text
    before: str         # the code edited, as written
    after: str          # what it became
    variable: str | None    # the name the line binds, if any
    differs: str = ""   # the student's value there against the edited code's, in words


def _numbers(node, parent) -> list:
    """(description, replacement) for a number of the arithmetic: -c, c + 1, c - 1, 2c, c / 2."""
    if not (isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value != 0):
        return []
    if not isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        return []  # an axis, an index, a shape: what the mutants' axis edit covers, or nothing to repair
    c = node.value
    out = []
    for new in dict.fromkeys((-c, c + 1, c - 1, 2 * c, c / 2)):
        if new != c:
            out.append((f"{c!r} became {new!r}", ast.Constant(new)))
    return out


def _factors(node) -> list:
    """(description, replacement) for a factor of one term put on the term beside it as well."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))):
        return []
    out = []
    for product, other, first in ((node.left, node.right, True), (node.right, node.left, False)):
        if not (isinstance(product, ast.BinOp) and isinstance(product.op, (ast.Mult, ast.Div))):
            continue

        def summed(term, other=other, first=first):
            return ast.BinOp(term, node.op, other) if first else ast.BinOp(other, node.op, term)
        out.append((f"`{ast.unparse(product.right)}` put on `{ast.unparse(other)}` too",
                    ast.BinOp(summed(product.left), product.op, product.right)))
        if isinstance(product.op, ast.Mult):
            out.append((f"`{ast.unparse(product.left)}` put on `{ast.unparse(other)}` too",
                        ast.BinOp(product.left, ast.Mult(), summed(product.right))))
    return out


def _sites(fdef, lines_in_source: set) -> list:
    """(node, description, replacement) for every repair edit of a node on one of ``lines_in_source``."""
    out = []
    parents = {}
    for parent in ast.walk(fdef):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    for node in ast.walk(fdef):
        if node is fdef or getattr(node, "lineno", None) not in lines_in_source:
            continue
        out += [(node, d, new) for d, new, _ in _edits(node)]
        out += [(node, d, new) for d, new in _numbers(node, parents.get(node)) + _factors(node)]
    return sorted(out, key=lambda s: (s[0].lineno, s[0].col_offset))


def _replaced(source: str, node, new) -> str:
    """``source`` with ``node``'s text replaced by ``new``'s, every other line where it was."""
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


def _source(answer):
    """(the function, its source dedented, the file's line of its first line, its ``def``) or None."""
    fn = inspect.unwrap(getattr(answer, "__func__", answer))
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        fdef = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    if not isinstance(fdef, ast.FunctionDef):
        return None
    return fn, source, fn.__code__.co_firstlineno, fdef


def repair(proof, lines: list, wrong_cases: list) -> Repair | None:
    """The one line of ``lines`` (the student's file's, in the order the data flow computes them) an edit of which
    makes every gradient right, with that edit; None when no edit does, or edits of two lines do.

    ``proof`` runs the edited code (``proof.right(fn, cases)``: every gradient right on those cases, or every case)
    and keeps the budget; ``wrong_cases``: the cases (from 0) where the student's gradients are wrong, tried first."""
    if isinstance(proof.answer, type) or not lines:
        return None  # a whole class: its methods are the student's too, and no one method is the answer
    found = _source(proof.answer)
    if found is None:
        return None
    fn, source, first, fdef = found
    fixes, seen = [], set()
    for node, description, new in _sites(fdef, {line - first + 1 for line in lines}):
        text = _replaced(source, node, new)
        if text in seen:  # two edits that write the same code (-c and the minus dropped, 2c and c + 1 for 1)
            continue
        seen.add(text)
        edited = rewritten(fn, text)
        if edited is None or not proof.right(edited, wrong_cases[:1]) or not proof.right(edited, None):
            continue
        line = node.lineno + first - 1
        if fixes and fixes[0][0] != line:
            return None  # two lines, each put right by an edit: one may only compensate the other
        fixes.append((line, node, new))
    if not fixes:
        return None
    line, node, new = fixes[0]
    statement = source.splitlines()[node.lineno - 1].strip()
    fixed = Repair(line, statement, *_shown(source, fdef, node, new), _bound(fdef, node.lineno))
    fixed.differs = _differs(proof, fn, _replaced(source, node, new), line)
    return fixed


def _shown(source: str, fdef, node, new) -> tuple:
    """(before, after) as the sentence shows the edit: a number with the operation it is in (``var_eps ** (-0.5)``,
    not ``0.5``), anything else as itself."""
    shown = node
    if isinstance(node, ast.Constant):
        parents = {c: p for p in ast.walk(fdef) for c in ast.iter_child_nodes(p)}
        while shown in parents and not isinstance(shown, ast.BinOp) and isinstance(parents[shown], (ast.BinOp,
                                                                                                    ast.UnaryOp)):
            shown = parents[shown]
    before = ast.get_source_segment(source, shown) or ast.unparse(shown)
    inner = ast.get_source_segment(source, node)
    if shown is node or inner is None or shown.lineno != shown.end_lineno or node.lineno != shown.lineno:
        return before, ast.unparse(new) if shown is node else ast.unparse(shown)
    at = len(source.splitlines()[node.lineno - 1].encode()[:node.col_offset].decode()) - \
        len(source.splitlines()[shown.lineno - 1].encode()[:shown.col_offset].decode())
    return before, before[:at] + ast.unparse(new) + before[at + len(inner):]


def _bound(fdef, line_in_source: int) -> str | None:
    for stmt in ast.walk(fdef):
        if isinstance(stmt, ast.Assign) and stmt.lineno == line_in_source and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            return stmt.targets[0].id
    return None


def _differs(proof, fn, source: str, line: int) -> str:
    """How the student's value at ``line`` (the last array it computes there) differs from the edited code's, in
    the first call where they differ; "" when no array of the line can be compared."""
    recorder = Recorder()
    edited = recorded(fn, recorder, source)
    if edited is None:
        return ""
    proof.run(edited, None)
    for mine, theirs in zip(proof.my_calls, recorder.calls):
        a = [r for r in mine.records if r.line == line and not r.given]
        b = [r for r in theirs.records if r.line == line and not r.given]
        if not a or not b or a[-1].value.shape != b[-1].value.shape or np.array_equal(a[-1].value, b[-1].value):
            continue
        got, right = a[-1].value, b[-1].value
        c = factor(got, right)
        if c is not None:
            return f"yours there is that value times {c:.6g}"
        tiny = max(1e-3 * float(np.abs(right).max()), 1e-300)
        bad = relative_errors(got, right, tiny) > 1e-6
        return f"yours there differs from that value at {int(bad.sum())} of {bad.size} entries"
    return ""
