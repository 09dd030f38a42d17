"""The student's arrays against numformer's: which equal which, and the student's counterpart of a step.

Used by grad_checks/first_wrong_step.py on the records of grad_checks/recorded_run.py. Two arrays are *the same*
when equal to 1e-9 of their largest entry, up to a transpose of the last two axes or a reshape (:func:`views`);
*scaled* when one is a scalar multiple of the other. A step of numformer's that the student computes nowhere has
a *counterpart*: the student's array that plays its part (:func:`counterpart`), whose line the diagnosis names.
"""
from __future__ import annotations

import numpy as np

SAME = 1e-9     # an intermediate equals numformer's: within this fraction of its largest entry


def views(a: np.ndarray, shape: tuple):
    """``a`` as an array of ``shape``: itself, reshaped, or its last two axes swapped (then reshaped)."""
    if a.shape == shape:
        yield a
    elif a.size == int(np.prod(shape)):
        yield a.reshape(shape)
    if a.ndim >= 2 and a.shape[-1] != 1 and a.shape[-2] != 1:
        t = a.swapaxes(-1, -2)
        if t.shape == shape:
            yield t
        elif t.size == int(np.prod(shape)):
            yield t.reshape(shape)


def same(a, b) -> bool:
    scale = max(float(np.abs(b).max()), float(np.abs(a).max()), 1e-300)
    return float(np.abs(a - b).max()) <= SAME * scale


def factor(a, b):
    """c when ``a`` = c ``b`` with c not 1 (nor 0), else None."""
    bb = float((b * b).sum())
    if bb == 0.0:
        return None
    c = float((a * b).sum()) / bb
    if abs(c - 1.0) <= 1e-9 or abs(c) <= 1e-12:
        return None
    return c if float(np.linalg.norm(a - c * b)) <= SAME * max(float(np.linalg.norm(a)), 1e-300) else None


def compare_call(ref, mine) -> dict:
    """{reference record index: ("right", student index) | ("scaled", c, student index) | ("missing",)} for one
    call. The arguments are given to both: the student's count as computing them, never as scaling them."""
    out = {}
    for r in ref.records:
        if r.given:
            out[r.index] = ("right", next((s.index for s in mine.records if s.given and s.code == r.code), None))
            continue
        status = ("missing",)
        if r.returned is not None:  # what is returned is compared as returned: a transposed dW is a wrong dW
            s = next((computed(mine, s) for s in mine.records if s.returned == r.returned), None)
            if s is not None and s.value.shape == r.value.shape and same(s.value, r.value):
                out[r.index] = ("right", s.index)
            elif s is not None and s.value.shape == r.value.shape and factor(s.value, r.value) is not None:
                out[r.index] = ("scaled", factor(s.value, r.value), s.index)
            else:
                out[r.index] = status
            continue
        for s in mine.records:
            for view in views(s.value, r.value.shape):
                if same(view, r.value):
                    status = ("right", s.index)
                    break
                if status[0] == "missing" and not s.given:
                    c = factor(view, r.value)
                    if c is not None:
                        status = ("scaled", c, s.index)
            if status[0] == "right":
                break
        out[r.index] = status
    return out



# -- the student's counterpart of a missing step --------------------------------------------------------------

def _student_map(ref_call, my_call) -> dict:
    """{student record index: the indices of numformer's records (arguments included) it equals, by value, up to a
    transpose or a reshape}: empty for a student's array that is none of numformer's."""
    out = {}
    for s in my_call.records:
        out[s.index] = {r.index for r in ref_call.records
                        if any(same(v, r.value) for v in views(s.value, r.value.shape))}
    return out


def _roots(call, index, memo) -> frozenset:
    """The arguments a record is computed from (through its operands)."""
    if index not in memo:
        rec = call.records[index]
        memo[index] = frozenset((rec.code,)) if rec.given else \
            frozenset().union(*[_roots(call, o, memo) for o in rec.operands]) if rec.operands else frozenset()
    return memo[index]


def computed(call, rec):
    """A name bound again (``return dx``) stands for the record it names: that one's line computed it."""
    while rec.kind == "name" and len(rec.operands) == 1 and np.array_equal(call.records[rec.operands[0]].value, rec.value):
        rec = call.records[rec.operands[0]]
    return rec


def _returned_as(call, r):
    """The position ``r`` is returned at, itself or under another name (``db = ... if with_bias else None``,
    ``return dx, dw, db``); None when it is not returned."""
    seen = set()
    while r.returned is None and r.index not in seen:
        seen.add(r.index)
        alias = next((c for c in call.records if r.index in c.operands and c.kind in ("name", "IfExp")
                      and c.value.shape == r.value.shape and np.array_equal(c.value, r.value)), None)
        if alias is None:
            return None
        r = alias
    return r.returned


def _ancestry(call, index, mapped, memo) -> set:
    """numformer's records equal to any array a student's record is computed from, at any depth."""
    if index not in memo:
        memo[index] = set()
        for o in call.records[index].operands:
            memo[index] |= mapped[o] | _ancestry(call, o, mapped, memo)
    return memo[index]


def counterpart(r, ref_call, my_call, verify=None):
    """(the student's record, its view as ``r``'s shape or None, a note) nearest to numformer's record ``r`` in
    one call; (None, None, "") when there is none.

    A candidate equals none of numformer's arrays, is not a constant, and is one of: the student's value
    returned where ``r`` is returned; the same helper called (``dropout_backward``); the same kind of operation
    (the same operator or its inverse, the same array function; any, for a helper's call or an in-place
    update) on at least one of ``r``'s operands; an array of ``r``'s shape computed from some of ``r``'s operands
    and nothing else (``dy * dy`` for ``dy * y``). An operand used in place of one of ``r``'s must be of its
    shape or computed from it (the softmax recomputed from y, in place of y): otherwise the array has another
    role. The nearest: for a helper's call (a composite step), the same helper, then the last candidate (what
    completes the step, not a piece of it); else the same kind, the most operands shared, the fewest replaced,
    ``r``'s shape, the closest values. No candidate: the student's array in the place ``r`` holds in its consumer
    (:func:`_in_consumer`)."""
    mapped = _student_map(ref_call, my_call)
    wanted = set(r.operands)
    memo_s, memo_r, memo_a = {}, {}, {}
    position = _returned_as(ref_call, r)
    returned = next((computed(my_call, s) for s in my_call.records if position is not None
                     and s.returned == position), None)
    composite = r.kind.startswith("call") or r.kind == "in place"
    found = []
    for s in my_call.records:
        if s.given or mapped[s.index] or s.kind == "name" or (s.value.size > 1 and np.ptp(s.value) == 0):
            continue
        right = set().union(*[mapped[o] for o in s.operands]) if s.operands else set()
        shared = right & wanted
        replaced = [o for o in s.operands if not (mapped[o] & wanted)]
        lacking = wanted - right
        view = next(iter(views(s.value, r.value.shape)), None)
        same_call = r.kind.startswith("call ") and s.kind == r.kind
        alike = _alike(r.kind, s.kind)
        if composite:  # a helper's step written out: computed, at any depth, from the step's operands
            shared = _ancestry(my_call, s.index, mapped, memo_a) & wanted
            if not (s is returned or same_call or (shared and view is not None)):
                continue
        elif not (s is returned or same_call or (shared and alike and (view is not None or not lacking))
                  or (shared and not replaced and not lacking and view is not None)
                  or (s.kind == r.kind and len(replaced) == 1 == len(lacking) and view is not None)):
            continue
        note = ""
        if replaced and len(lacking) == 1 and len(replaced) == 1:
            theirs, ours = my_call.records[replaced[0]], ref_call.records[next(iter(lacking))]
            # the wrong argument (or a view of one) of the shape of the right one, or an array computed from it
            argument = theirs.given or any(ref_call.records[i].given for i in mapped[theirs.index])
            related = (argument and theirs.value.size == ours.value.size) or \
                _roots(my_call, theirs.index, memo_s) >= _roots(ref_call, ours.index, memo_r)
            if not related and s is not returned and not same_call:
                continue  # computed from something unrelated to what it replaces: another role
            if not shared and not related:
                continue
            if related:
                note = f"; it uses `{theirs.code}`" + (f" (line {theirs.line})" if theirs.line else "") + \
                       f" where numformer's uses {ours.variable or '`' + ours.code + '`'}"
        elif shared and not replaced and lacking:
            note = f"; numformer's is computed from {_names(ref_call, wanted)}, yours from {_names(ref_call, shared)}"
        distance = float(np.abs(view - r.value).max()) if view is not None else np.inf
        if composite:
            rank = (not same_call, s is not returned, view is None, distance, s.index)
        else:
            rank = (not alike and s is not returned, s.kind != r.kind, -len(shared), len(replaced), view is None,
                    distance, s.index)
        found.append((rank, s, view, note))
    if not found:
        return _in_consumer(r, ref_call, my_call, mapped)
    found.sort(key=lambda f: f[0])
    if composite and not found[0][0][0]:
        return found[0][1], found[0][2], found[0][3]  # the same helper called: that call is the step
    if composite and verify is not None:
        # a helper's step written out has pieces, and uses after it, of its shape: the counterpart is the earliest
        # array that numformer's code, given it in the step's place, carries on from as the student's does
        for _, s, view, note in sorted(found, key=lambda f: f[1].index):
            if view is not None and verify(view):
                return s, view, note
        # none that numformer's code carries on from: the student's route has no such step; say so, not a guess
        if returned is None:
            return None, None, ""
    return found[0][1], found[0][2], found[0][3]


def _in_consumer(r, ref_call, my_call, mapped):
    """The student's array in the place ``r`` holds where it is used: numformer's ``(dy * xhat).sum(axis=0)``
    consumes ``dy * xhat``; the student's ``(dxhat * xhat).sum(axis=0)``, returned in its place, consumes
    ``dxhat * xhat``, which is ``r``'s counterpart even though numformer computes it too (for another use)."""
    for c in ref_call.records:
        position = _returned_as(ref_call, c) if r.index in c.operands else None
        if position is None:
            continue
        theirs = next((computed(my_call, s) for s in my_call.records if s.returned == position), None)
        if theirs is None or mapped[theirs.index] or theirs.kind != c.kind:
            continue
        others = set(c.operands) - {r.index}
        place = [o for o in theirs.operands if not (mapped[o] & others)]
        if len(place) == 1:
            s = my_call.records[place[0]]
            view = next(iter(views(s.value, r.value.shape)), None)
            if view is not None:
                return s, view, f"; your `{theirs.code}` (line {theirs.line}) uses it where numformer's uses `{r.code}`"
    return None, None, ""


def _names(call, indices) -> str:
    names = [call.records[i].variable or f"`{call.records[i].code}`" for i in sorted(indices)]
    return " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]


_FAMILIES = ({"Mult", "Div"}, {"Add", "Sub"})


def _alike(ours: str, theirs: str) -> bool:
    """Whether the student's expression of kind ``theirs`` may be their way of computing numformer's of kind
    ``ours``: the same operator (or its inverse: a division where numformer multiplies) or array function, or
    either one a function call or an in-place update (numformer's ``scatter_add`` is a student's ``np.add.at``)."""
    if ours == theirs or any(ours in f and theirs in f for f in _FAMILIES):
        return True
    return any(k.startswith("call") or k == "in place" for k in (ours, theirs))

