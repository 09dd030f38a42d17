"""A fix suggested at the line a diagnosis names: one edit of the student's statement that makes every gradient right.

The blame is decided elsewhere (grad_checks/first_wrong_step.py: where the value a line must hold is known); an edit
that makes the output right may compensate a mistake on another line, so it only *suggests* how the line named could
read. The edits, one at a time, the student's code replayed with each (the same replaced() mutants are made with):
grad_checks/mutants.py's (a sign, a term or a factor dropped, a transpose, a sum for a mean, an axis, a masking,
keepdims); a number changed (-c, c + 1, c - 1, 2c, c / 2); a factor put on the term beside it too (``a * b - c`` ->
``(a - c) * b``); the operands grouped the other way (``a / b * c`` -> ``a / (b * c)``, said as what Python's
precedence reads when the student wrote no parentheses).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass

from .mutants import _edits, replaced
from .recorded_run import rewritten


@dataclass
class Repair:
    """One edit of the student's line that makes every gradient right."""

    line: int           # the line of the student's file
    before: str         # the code edited, as written
    after: str          # what it became
    reading: str = ""   # how Python groups ``before`` when the student wrote no parentheses, for a regrouping


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


_FLAT = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.MatMult: 2, ast.Pow: 3}


def _regrouped(node, source) -> list:
    """(description, replacement, the reading) for ``(a op b) op2 c`` grouped as ``a op (b op2 c)``; the reading is
    ``(a op b) op2 c`` when the source writes no parentheses around ``a op b`` (Python's precedence grouped it)."""
    inner = node.left if isinstance(node, ast.BinOp) else None
    if not (isinstance(inner, ast.BinOp) and type(node.op) in _FLAT and type(inner.op) in _FLAT):
        return []
    new = ast.BinOp(inner.left, inner.op, ast.BinOp(inner.right, node.op, node.right))
    text = ast.get_source_segment(source, node) or ""
    left = ast.get_source_segment(source, inner) or ""
    reading = f"({ast.unparse(inner)}) {ast.unparse(ast.BinOp(ast.Name('_'), node.op, ast.Name('_')))[2:-2]} " \
              f"{ast.unparse(node.right)}" if text.startswith(left) and not text.startswith("(") else ""
    return [("regrouped", new, reading)]


def _sites(fdef, lines_in_source: set, source: str = "") -> list:
    """(node, description, replacement) for every repair edit of a node on one of ``lines_in_source``."""
    out = []
    parents = {}
    for parent in ast.walk(fdef):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    for node in ast.walk(fdef):
        if node is fdef or getattr(node, "lineno", None) not in lines_in_source:
            continue
        out += [(node, d, new, "") for d, new, _ in _edits(node)]
        out += [(node, d, new, "") for d, new in _numbers(node, parents.get(node)) + _factors(node)]
        out += [(node, d, new, reading) for d, new, reading in _regrouped(node, source)]
    return sorted(out, key=lambda s: (s[0].lineno, s[0].col_offset))


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


def suggestion(proof, line: int, term: str = "") -> Repair | None:
    """The first edit of the student's statement at ``line`` (their file's) after which every gradient of every case
    is right, or None: a suggestion for the line named, never a proof (``proof``: the replays, see
    grad_checks/first_wrong_step.py's ``_Proof``, and their budget). ``term``: the code of the expression named
    there; an edit is then of it, inside it or around it, never of a term beside it (``x * 2.0`` for ``x * 1.0``
    where ``dy * 0.5`` is named would compensate)."""
    if isinstance(proof.answer, type):
        return None  # a whole class: its methods are the student's too, and no one method is the answer
    found = _source(proof.answer)
    if found is None:
        return None
    fn, source, first, fdef = found
    seen, sites = set(), _sites(fdef, {line - first + 1}, source)
    named = [n for n, *_ in sites if ast.get_source_segment(source, n) == term]
    if named:
        near = {n for m in named for n in ast.walk(m)} | {n for n in ast.walk(fdef) if any(
            m in set(ast.walk(n)) for m in named)}
        sites = [site for site in sites if site[0] in near]
    for node, description, new, reading in sites:
        text = replaced(source, node, new)
        if text in seen:  # two edits that write the same code (-c and the minus dropped, 2c and c + 1 for 1)
            continue
        seen.add(text)
        edited = rewritten(fn, text)
        if edited is not None and proof.right(proof.run(edited, None)):
            return Repair(line, *_shown(source, fdef, node, new), reading)
    return None


def _shown(source: str, fdef, node, new) -> tuple:
    """(before, after) as the sentence shows the edit: a number with the operation it is in (``var_eps ** (-0.5)``,
    not ``0.5``), anything else as itself."""
    shown = node
    if isinstance(node, (ast.Constant, ast.UnaryOp)):  # a number with what it is in: a power, a product, a step
        parents = {c: p for p in ast.walk(fdef) for c in ast.iter_child_nodes(p)}
        while shown in parents and not isinstance(shown, (ast.BinOp, ast.Subscript)) and isinstance(
                parents[shown], (ast.BinOp, ast.UnaryOp, ast.Slice, ast.Subscript)):
            shown = parents[shown]
    before = ast.get_source_segment(source, shown) or ast.unparse(shown)
    inner = ast.get_source_segment(source, node)
    if shown is node or inner is None or shown.lineno != shown.end_lineno or node.lineno != shown.lineno:
        return before, ast.unparse(new) if shown is node else ast.unparse(shown)
    at = len(source.splitlines()[node.lineno - 1].encode()[:node.col_offset].decode()) - \
        len(source.splitlines()[shown.lineno - 1].encode()[:shown.col_offset].decode())
    return before, before[:at] + ast.unparse(new) + before[at + len(inner):]
