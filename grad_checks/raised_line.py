"""An exception raised inside a student's backward, told in the exercise's terms: what the raising line reads.

``ValueError at my_multihead.py:88 in backward: operands could not be broadcast together with shapes
(3,5,8) (3,6,8)`` says where, not what: the student wrote ``return dx + dkv`` for every case, and in the
encoder-decoder case those are two different gradients (the queries' input's and the memory's), which
numformer returns apart. The grading knows what each of the student's arrays is, by value: the student's
backward and numformer's are both run recorded on the same cases (grad_checks/recorded_run.py), and an array
of the student's that equals one of numformer's intermediates *is* that intermediate. So for the case that
raised, each name the raising line reads is given with its shape and what it is in numformer's backward (its
name there, or the returned value it is), and when numformer returns several arrays in that case the line
says which. Names whose value numformer never computes are given with their shape alone.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from .counterparts import reduced, same
from .first_wrong_step import REDUCTIONS, Recordings

_SUMS = REDUCTIONS[:2]  # a sum or a mean: reductions whose result one more reduction can continue (max, min: not so)


ORDINALS = ("first", "second", "third", "fourth", "fifth", "next")


def _line_and_names(file, line: int) -> tuple[str, list[str]]:
    """(the source of ``line`` of ``file``, the names it reads, in order, each once)."""
    text = Path(file).read_text(encoding="utf-8")
    source = text.splitlines()[line - 1].strip()
    names = []
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.lineno == line
                and node.id not in names):
            names.append(node.id)
    return source, names


def _latest(call, name):
    """The student's last array bound to ``name`` in ``call`` (an argument or a computed value), or None."""
    found = [r for r in call.records if r.variable == name or (r.given and r.code == name)]
    return found[-1] if found else None


def _what(ex, ref_call, record) -> str | None:
    """What ``record``'s value is in numformer's backward for this call, or None when numformer computes no such
    array: a returned value (by the exercise's output name), a named intermediate, or the expression; or numformer's
    of another shape, with what makes the student's differ (an axis of length 1 not kept, a reduction more), and the
    student's line that computes it, the mistake's (the line that raised only reads it)."""
    matches = [r for r in ref_call.records if r.value.shape == record.value.shape and same(record.value, r.value)]
    if not matches:
        return _of_another_shape(ref_call, record)
    returned = [r for r in matches if r.returned is not None]
    if returned:
        r = returned[-1]
        if r.returned < len(ex.outputs):
            return f"numformer's returned {ex.outputs[r.returned]}" + (f" (`{r.code}`)" if r.code != ex.outputs[r.returned] else "")
        return f"the {ORDINALS[min(r.returned, len(ORDINALS) - 1)]} array numformer returns (`{r.code}`)"
    named = [r for r in matches if r.variable or r.given]
    r = (named or matches)[0]
    if r.given:
        return f"the argument {r.code}"
    term = ex.names.get(r.code) or ex.names.get(r.variable or "")
    return f"numformer's `{r.variable or r.code}`" + (f", {term}" if term else "")


def _of_another_shape(ref_call, record) -> str | None:
    """"numformer's `X` without its axis of length 1 (shape S): keepdims=True belongs on your line N" or "... summed
    over its axis k as well ...", for the first of numformer's records ``record`` is so; else None."""
    line = record.statement or record.line
    arrays = [r for r in ref_call.records if not r.given and r.value.ndim]
    for r in arrays:  # the same values, an axis of length 1 more or less: first, the nearer of the two
        if r.value.size == record.value.size and r.value.shape != record.value.shape and \
                tuple(n for n in r.value.shape if n != 1) == tuple(n for n in record.value.shape if n != 1) and \
                same(record.value, r.value.reshape(record.value.shape)):
            kept = "keepdims=True belongs" if record.kind in REDUCTIONS else "that axis belongs"
            return (f"numformer's `{r.code}` without its axis of length 1 (shape {tuple(r.value.shape)}): {kept} on "
                    f"your line {line}")
    for r in arrays:
        how = reduced(r.value, record.value)
        if how and record.kind in _SUMS and r.kind in _SUMS:  # numformer's sums further
            return (f"short of an axis: numformer's `{r.code}` (shape {tuple(r.value.shape)}) is it "
                    f"{how.split(' (shape')[0]}; the reduction on your line {line} is wrong")
    for r in arrays:
        how = reduced(record.value, r.value)
        if how:
            return f"numformer's `{r.code}` {how}: the reduction on your line {line} is wrong, one too many"
    return None


def raised_line(ex, answer, seed: int, file, time_limit, case_number: int, case_name: str, error: str,
                recordings=None) -> str | None:
    """The sentence for case ``case_number`` (from 1), which raised ``error`` (the outcome's line, which names
    ``FILE:LINE``) inside the student's ``file``; None when the line is not in that file or nothing is known.
    ``recordings``: the student's run and numformer's as the first wrong steps recorded them (grad_checks/
    first_wrong_step.py's Recordings), else recorded here."""
    if file is None:
        return None
    found = re.search(rf"at {re.escape(Path(file).name)}:(\d+) in ", error)
    if found is None:
        return None
    line = int(found[1])
    source, names = _line_and_names(file, line)
    recordings = recordings or Recordings(ex, answer, seed, file, time_limit)
    mine, ours = recordings.student[0], recordings.reference[0]
    # the case's call that raised, and numformer's call at its place in the case (a recording knows each call's case)
    mine_here = [c for c in mine or [] if c.case == case_number - 1]
    ours_here = [c for c in ours or [] if c.case == case_number - 1]
    at = next((i for i, c in enumerate(mine_here) if not c.returned), 0)
    if at >= len(mine_here) or at >= len(ours_here):
        return None
    my_call, ref_call = mine_here[at], ours_here[at]
    said, returned_read = [], 0
    for name in names:
        record = _latest(my_call, name)
        if record is None or record.value is None:
            continue
        what = _what(ex, ref_call, record)
        returned_read += what is not None and ("returns" in what or "returned" in what)
        shape = tuple(record.value.shape)
        said.append(f"`{name}` {shape} is {what}" if what else f"`{name}` {shape} is no array numformer computes here")
    # the line's own reductions (``dy.sum(axis=0)`` (3, 4, 8) where numformer's sums to (4, 8)): not bound to a name
    for record in my_call.records:
        if record.statement == line and not record.given and not record.variable and record.kind in _SUMS \
                and not any(r.value.shape == record.value.shape and same(record.value, r.value)
                            for r in ref_call.records) and (what := _of_another_shape(ref_call, record)) is not None:
            said.append(f"`{record.code}` {tuple(record.value.shape)} is {what}")
    if not said:
        return None
    returned = sorted((r for r in ref_call.records if r.returned is not None), key=lambda r: r.returned)
    apart = ""
    if len(returned) > 1 and returned_read > 1:  # the line mixes arrays numformer keeps apart
        outs = [ex.outputs[r.returned] if r.returned < len(ex.outputs) else f"`{r.code}`" for r in returned]
        apart = f"; in this case numformer returns {len(returned)} arrays apart, ({', '.join(outs)})"
    return (f"case {case_number} ({case_name}) raised at {Path(file).name}:{line} (`{source}`), where "
            + "; ".join(said) + apart)
