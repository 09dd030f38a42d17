"""State kept between calls: a student's backward whose result depends on the calls before it.

A backward is a function of its arguments (and the layer's saved tensors): the same case must give the same gradients
whenever it runs. A buffer added into and never zeroed, a cache, a mutable default, a class attribute, a
hyper-parameter kept from the first call (the smoothing eps cached at module level): each makes the first call right
and a later one wrong. So the cases run again: a second pass on new layers in the reverse order (a buffer that
grows), then, when that repeats the first exactly, the same with the student's module-level names, defaults and
attributes put back as they were before the first pass (deep copies: a flag kept from the case that ran last and now
runs first), and every case but the first alone as the first call, put back likewise: a value kept from the first call
stops changing after it, and the case with another eps or p run first computes something else. A case whose gradients
differ (to the bit) is named, with whether it was right as the first call and what in the student's file changed
(a fingerprint of each place before the first pass and after), with its line.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .candidates import compare, floor, run_class


def _fingerprint(value, depth: int = 0):
    """What a value holds, to compare before and after: an array's bytes (hashed), a container's items, a
    scalar itself; anything else by identity (a rebinding shows, a change inside it not)."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, str(value.dtype), hashlib.sha1(np.ascontiguousarray(value).tobytes()).hexdigest())
    if depth < 3 and isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_fingerprint(v, depth + 1) for v in value))
    if depth < 3 and isinstance(value, dict):
        return ("dict", tuple((repr(k), _fingerprint(v, depth + 1)) for k, v in value.items()))
    if depth < 3 and isinstance(value, (set, frozenset)):
        return ("set", len(value), tuple(sorted(map(repr, value))))
    if isinstance(value, (int, float, complex, str, bytes, bool, type(None))):
        return value
    return ("object", id(value))


def _places(answer) -> dict:
    """{(kind, name): (value, where it is: a dict or an object with that attribute)} of where a student's code can
    keep state: the module-level names of the file that defines it, its default arguments and attributes, its class's
    attributes."""
    places = {}
    fn = answer
    module = sys.modules.get(getattr(answer, "__module__", None) or "")
    namespace = getattr(fn, "__globals__", None) or (vars(module) if module is not None else {})
    for name, value in namespace.items():  # (a function made by a call, ``def _target_of`` under ``if ... is None``,
        # is a value kept: the file's own functions and classes, and what it imports, are its code)
        made = inspect.isfunction(value) and bool(value.__code__.co_flags & inspect.CO_NESTED)
        if not (name.startswith("__") or callable(value) and not made or type(value).__name__ == "module"):
            places[("name", name)] = value, namespace
    # the answer and every function its file defines (a helper's ``_memo={}`` or ``.kept`` keeps state too): their
    # defaults, closures' cells (``seen = {}`` in the function making it) and attributes
    helpers = [v for v in namespace.values() if inspect.isfunction(v) and v.__module__ == getattr(fn, "__module__", 0)]
    for f in [fn] + [h for h in helpers if h is not fn]:
        if getattr(f, "__defaults__", None):
            places[("default", f.__name__)] = f.__defaults__, f
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()) if inspect.isfunction(f) else ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if name != "__class__" and not callable(value) and type(value).__name__ != "module":
                places[("closure", f"{f.__name__}.{name}")] = value, cell
        for name, value in (vars(f) if callable(f) and not isinstance(f, type) else {}).items():
            if not name.startswith("__"):
                places[("attribute", f"{f.__name__}.{name}")] = value, f
    if isinstance(answer, type):
        for klass in answer.__mro__:
            if klass.__module__ == answer.__module__:
                for name, value in vars(klass).items():
                    if not (name.startswith("__") or callable(value) or isinstance(value, (property, staticmethod,
                                                                                           classmethod))):
                        places[("attribute", f"{klass.__name__}.{name}")] = value, klass
    return places


def _put(key, holder, value) -> None:
    """The place ``key`` (see :func:`_places`) set to ``value`` (:data:`GONE`: removed, a place made since)."""
    name = key[1].split(".")[-1] if key[0] in ("attribute", "closure") else "__defaults__" if key[0] == "default" \
        else key[1]
    if key[0] == "closure":
        if value is not GONE:
            holder.cell_contents = value
        return
    if isinstance(holder, dict):
        holder.pop(name, None) if value is GONE else holder.__setitem__(name, value)
    elif value is not GONE:
        setattr(holder, name, value)
    elif name in vars(holder):
        delattr(holder, name)


GONE = object()  # a place the snapshot did not find: put back by removing it




def snapshot(answer) -> dict:
    """{(kind, name): (fingerprint, a deep copy or None)} of every place :func:`_places` finds, before the first
    pass: what to compare after it, and what to put back for a fresh order."""
    out = {}
    for key, (value, _) in _places(answer).items():
        try:
            kept = (copy.deepcopy(value),)
        except Exception:  # noqa: BLE001  (a value that cannot be copied: compared, never put back)
            kept = None
        out[key] = (_fingerprint(value), kept)
    return out


def _put_back(answer, before: dict) -> None:
    """Every place as :func:`snapshot` found it (a deep copy again: a fresh order may change it once more)."""
    for key, (value, holder) in _places(answer).items():
        kept = before.get(key, (None, (GONE,)))[1]
        if kept is not None:
            _put(key, holder, kept[0] if kept[0] is GONE else copy.deepcopy(kept[0]))


def _line_of(file, kind: str, name: str) -> int | None:
    """The line of ``file`` where the state is made: the module-level assignment of a name, the ``def`` of a
    function with a default argument, the assignment in a class body."""
    if file is None:
        return None
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    target = name.split(".")[-1]
    for node in ast.walk(tree):
        if kind == "default" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.lineno
        if kind in ("name", "attribute", "closure") and isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == target for t in targets):
                return node.lineno
    return None


def _changed(before: dict, answer, file) -> tuple[list[str], list[int]]:
    """(``_scratch`` (my_layernorm.py:12), a module-level name, for each place whose fingerprint changed; the lines of
    the student's function or class that read or set one of those places)."""
    after = {key: value for key, (value, _) in snapshot(answer).items()}
    said, lines = [], set()
    for key in sorted(set(before) | set(after), key=str):
        if before.get(key, (None,))[0] == after.get(key) or key[0] == "closure" and key not in before:
            continue  # (the cells of a function made since: that function, a value kept, is the place said)
        kind, name = key
        line = _line_of(file, kind, name)
        at = f" ({Path(file).name}:{line})" if line is not None else ""
        what = {"name": "a module-level name", "default": "a default argument of", "attribute": "an attribute",
                "closure": "a variable of its closure"}
        said.append(f"{what[kind]} {name}{at}" if kind == "default" else f"{name}{at}, {what[kind]}")
        lines |= _uses(file, answer, kind, name)
    return said, sorted(lines)


def _uses(file, answer, kind: str, name: str) -> set:
    """The lines of the student's file where the kept place feeds what the code computes: the name, attribute or
    parameter read, not set nor tested (``if _SCALE is None:`` and the fill under it are harmless once no value is
    read from it: the edit is at the reads), in the student's ``answer`` (its function, or its class's methods) or a
    function of the file it reads it in (a helper's ``_row_mean``); a default's in its function, else its ``def``.
    Where it is only set or tested, those lines."""
    if file is None:
        return set()
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set()
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    own = name if kind == "default" else getattr(answer, "__name__", None)  # a default: the function it is of
    body = next((n for n in defs if n.name == own), None)
    if body is None:
        return set()
    if kind == "default":  # a parameter whose default can change (not a constant)
        args = body.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        targets = {a.arg for a, d in pairs if not isinstance(d, ast.Constant)}
        lines = _reads([body], targets, names=True)
        return lines or {body.lineno}
    targets = {name.split(".")[-1]}
    names = kind in ("name", "closure")
    elsewhere = _reads([d for d in defs if d is not body], targets, names)
    # a closure's cell is read by the closure itself: the answer's line calling it takes the value (a module name or
    # attribute read by a helper: the helper's line, where the value is read)
    called = _callers(body, answer, elsewhere) if kind == "closure" else set()
    return _reads([body], targets, names) or called or elsewhere or \
        _reads([body], targets, names, every=True)


def _callers(body, answer, lines: set) -> set:
    """The lines of ``body`` (the answer's) calling a function of the file by a module-level name (``_scale_of(mask)``,
    bound to a closure made by a factory) whose code holds one of ``lines``: where the answer takes the value a helper
    reads from the kept place (that read is the helper's, not the line a student edits)."""
    namespace = getattr(inspect.unwrap(answer), "__globals__", None) or {}
    out = set()
    for node in ast.walk(body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            code = getattr(namespace.get(node.func.id), "__code__", None)
            held = {line for _, _, line in code.co_lines() if line is not None} if code is not None else set()
            if held & lines:
                out.add(node.lineno)
    return out


def _reads(bodies, targets: set, names: bool, every: bool = False) -> set:
    """The lines of ``bodies`` that read one of ``targets`` (names, else attributes) for what they compute: not a
    test that only guards filling it, nor its fill (``_CACHE["k"] = ...``, ``_CACHE.append(x)``); ``every``: every
    line naming one."""
    def sets(t):
        t = t.value if isinstance(t, ast.Subscript) else t
        return isinstance(t, ast.Name) and t.id in targets or isinstance(t, ast.Attribute) and t.attr in targets

    def fill(st):  # ``_CACHE = ...``, ``_CACHE["k"] = ...``, ``_CACHE.append(...)`` or ``def _CACHE(...)``
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Attribute):
            return sets(st.value.func.value)
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return st.name in targets
        return isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and any(
            sets(t) for t in (st.targets if isinstance(st, ast.Assign) else [st.target]))

    out = set()
    for body in bodies:
        nodes = list(ast.walk(body))
        # a test choosing what is computed (``dy if _PRE else ...``, ``if _PRE: dz = dy``) reads the place; one
        # that only guards filling it (``if _SCALE is None: _SCALE = x``) does not
        # (a guard: a test of the place alone over a body that fills it, what else it binds only for the fill)
        tests = {id(t) for node in nodes if isinstance(node, (ast.If, ast.While)) and any(
                 fill(st) for st in node.body + node.orelse) and _of_the_place(node.test, targets)
                 for t in ast.walk(node.test)}
        tests |= {id(t) for node in nodes if isinstance(node, (ast.Subscript, ast.Attribute))
                  and isinstance(node.ctx, ast.Store) for t in ast.walk(node.value)}  # _CACHE["k"] = ...: a fill
        tests |= {id(t) for node in nodes if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and isinstance(node.value.func, ast.Attribute) for t in ast.walk(node.value.func.value)}
        for node in nodes:
            if names and isinstance(node, ast.Name) and node.id in targets or \
                    not names and isinstance(node, ast.Attribute) and node.attr in targets:
                if every or isinstance(node.ctx, ast.Load) and id(node) not in tests:
                    out.add(node.lineno)
    return out


def _of_the_place(test, targets: set) -> bool:
    """Whether ``test`` reads nothing but the place (``_CACHE is None``, ``not _FIRST``, ``getattr(Residual, "_pre",
    None) is None``): names among ``targets``, the owner of a target attribute, builtins."""
    owners = {n.value.id for n in ast.walk(test) if isinstance(n, ast.Attribute) and n.attr in targets
              and isinstance(n.value, ast.Name)}
    owners |= {n.args[0].id for n in ast.walk(test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
               and n.func.id in ("getattr", "hasattr") and len(n.args) > 1 and isinstance(n.args[0], ast.Name)
               and isinstance(n.args[1], ast.Constant) and n.args[1].value in targets}
    read = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return read <= targets | owners | {"self", "len", "getattr", "hasattr", "isinstance"}


def _same(a, b) -> bool:
    """Two outcomes of the same case: the same gradients to the bit, or the same error."""
    if (a.grads is None) != (b.grads is None):
        return False
    if a.grads is None:
        return a.error == b.error
    return a.grads.keys() == b.grads.keys() and all(np.array_equal(a.grads[k], b.grads[k]) for k in a.grads)


def _right(outcome, reference) -> bool:
    if outcome.grads is None or reference.grads is None:
        return False
    tiny = floor(reference.grads)
    return all(k in outcome.grads and compare(outcome.grads[k], g, tiny)[0] <= 1e-6 for k, g in reference.grads.items())


def kept_state(ex, cls, answer, seed, file, time_limit, first: list, reference: list, before: dict) -> KeptState | None:
    """None when every case gives the same outcome run again, backwards, on new layers; else (a KeptState) the sentence that
    says the backward keeps state between calls: which case, how its outcome changed, and what holds the state.
    ``first``: the outcomes of the first pass, in order; ``before``: :func:`snapshot` taken before it."""
    n = len(first)
    if n == 0:
        return None
    for put_back in (False, True):  # the second time from the state before the first pass: a flag kept from the
        # case that ran last in the first pass, and now runs first, shows (the bias flag of the no-bias case); a
        # buffer per shape, grown, shows the first time
        if put_back:
            _put_back(answer, before)
        _, again = run_class(ex, cls, seed, file, time_limit, order=range(n - 1, -1, -1))
        differ = [i for i in range(n) if not _same(first[i], again[i])]
        if differ:
            break
    if differ:  # case k ran after k cases in the first pass and after n - 1 - k in the second
        k = differ[0]
        runs = [(k, first[k]), (n - 1 - k, again[k])]
    else:  # each case as the first call, the student's state as it was before the first pass
        fresh = {}
        for k in range(1, n):
            _put_back(answer, before)
            fresh[k] = run_class(ex, cls, seed, file, time_limit, order=[k])[1][k]
            if not _same(first[k], fresh[k]):
                break
        differ = [k for k, out in fresh.items() if not _same(first[k], out)]
        if not differ:
            return None
        k = differ[0]
        runs = [(0, fresh[k]), (k, first[k])]
    runs = sorted(runs, key=lambda r: r[0])
    (early, e_out), (late, l_out) = runs
    calls = lambda m: "as the first call" if m == 0 else f"after {m} call{'s' if m > 1 else ''}"  # noqa: E731
    right_early, right_late = _right(e_out, reference[k]), _right(l_out, reference[k])
    if right_early != right_late:
        how = (f"case {k + 1} is {'right' if right_early else 'wrong'} {calls(early)} of your backward and "
               f"{'right' if right_late else 'wrong'} {calls(late)}")
    else:
        how = f"case {k + 1} gives other gradients {calls(early)} of your backward than {calls(late)}"
    holders, lines = _changed(before, answer, file)
    read = (f"; the mistake is on your line{'s' if len(lines) > 1 else ''} " + (
        ", ".join(map(str, lines[:-1])) + f" and {lines[-1]}" if len(lines) > 1 else str(lines[0]))
        + f", which take{'s' if len(lines) == 1 else ''} its value") if lines else ""
    where = ("; what changes from one call to the next: " + ", ".join(holders) + read) if holders else \
        "; no module-level name, default argument or class attribute of your file changed: look for an array " \
        "your backward writes into and reads back (or random numbers)"
    return KeptState(f"your backward keeps state between calls: {how}{where}. A backward must compute each call "
                     "from its arguments alone", tuple(lines))


@dataclass(frozen=True)
class KeptState:
    """What :func:`kept_state` found: the sentence, and the student's lines that read or set the kept places (the
    mistake's location: a backward computed from its arguments alone needs none of them)."""

    said: str
    lines: tuple = ()
