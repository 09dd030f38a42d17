"""A child's backward handed another child (``self.ffn_residual.backward(dy, self.self_attn)``): the sub-layer passed.

A composite layer's backward (the encoder's and decoder's layers, Section 3.1 and Figure 1) calls each residual's
backward with the sub-layer it wraps; numformer's passes ``self.ffn`` to ``self.ffn_residual.backward``. What the
student's call must pass there is known, as a value is: the object numformer's call of the same child passes at the
same place. So every call of the student's whose child and method are numformer's, but whose ``self.X`` argument is
another ``self.Y`` than numformer's, is a candidate; the student's code is replayed with numformer's object there
(each alone, then all together), and the calls whose edit puts every gradient right are the first wrong steps: a
line named because the value it must hold is known and, put there, every gradient is right.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

from .own_route import _source
from .mutants import replaced
from .recorded_run import rewritten


def _child_call(node):
    """(child, method) of a call ``self.child.method(...)``, else None."""
    f = node.func if isinstance(node, ast.Call) else None
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and isinstance(f.value.value, ast.Name) \
            and f.value.value.id == "self":
        return f.value.attr, f.attr
    return None


def _own_attribute(node) -> str | None:
    """``X`` of an argument ``self.X``, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _passed(fdef) -> dict:
    """{(child, method): [the ``self.X`` names passed, by position (None where not one)]} of the first call of each."""
    out = {}
    for node in ast.walk(fdef):
        key = _child_call(node)
        if key is not None and key not in out:
            out[key] = [_own_attribute(a) for a in node.args]
    return out


def sublayers_passed(ex, proof) -> list:
    """[(the student's line, the call's code, what it passes, what numformer's passes)] for the calls of a method
    exercise's answer that hand a child another sub-layer than numformer's do, when numformer's object there makes
    every gradient right (one call alone, or all of them together); [] otherwise."""
    answer = proof.answer
    if not ex.is_method or not isinstance(answer, type):
        return []
    found = _source(getattr(answer, ex.target.__name__, None))
    try:
        ours = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(ex.target)))).body[0]
    except (OSError, TypeError, SyntaxError):
        return []
    if found is None:
        return []
    fn, source, first, fdef = found
    theirs = _passed(ours)
    edits = []  # (node, numformer's name, the student's)
    for node in ast.walk(fdef):
        key = _child_call(node)
        if key is None or key not in theirs:
            continue
        for arg, want in zip(node.args, theirs[key]):
            have = _own_attribute(arg)
            if have is not None and want is not None and have != want:
                edits.append((node, arg, want, have))
    if not edits:
        return []
    for chosen in [[e] for e in edits] + ([edits] if len(edits) > 1 else []):
        text = source
        for _, arg, want, _ in sorted(chosen, key=lambda e: (e[1].lineno, e[1].col_offset), reverse=True):
            text = replaced(text, arg, ast.parse(f"self.{want}", mode="eval").body)
        edited = rewritten(fn, text)
        got = proof.run(edited, None) if edited is not None else None
        if got is not None and proof.right(got, list(range(len(got)))):  # every case (the student's may all raise)
            return [(first + node.lineno - 1, ast.get_source_segment(source, node), have, want)
                    for node, _, want, have in sorted(chosen, key=lambda e: e[0].lineno)]
    return []
