"""Whether a student's backward is their own: one that hands the work to numformer's own backward for the
exercise grades EXACT, since it *is* numformer's; this finds such code, so that the grading can say so.

What counts is numformer's function for the exercise (its reference, ``ex.target``: for a method, the method as
written) and the reference's fast twins (the kernels registered under its dotted name, numformer/kernels/twins.py).
Nothing else: a composite calling its children's backward (``MultiHeadAttention.backward`` calling
``self.attention.backward``) or attention's backward calling numformer's ``softmax_backward`` is the student using
pieces the exercise does not ask for.

Two ways a student's code gets there:

* it *calls* one, by any route: while :func:`watch` is on, those functions refuse to run
  (grad_checks/trip_wires.py), whoever calls them: the student's line, a thread, a torch hook, ``functools``, a
  descriptor, a C extension's callback, the grader itself through what the student's ``backward`` resolves to.
  Each refused call is an :class:`OwnCall`, at the nearest line of the student's file (or a file beside it: a
  helper module it imports; ``load_file`` puts the folder on the path for that) on the calling thread's stack. The
  grader's own calls run: the output guard of grad_checks/exercise.py runs the reference on a copy of the
  arguments after the student's function has returned, from a code object it permits.
* it *is* one: ``layernorm_backward = L.layernorm_backward`` (or ``backward = NumformerLayer.backward``, a
  ``@property`` returning ``super().backward``, any descriptor) is resolved as the grader will call it and compared
  with numformer's before any call (:func:`reexported`).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import types
from dataclasses import dataclass
from pathlib import Path

from .trip_wires import NotYours, original_code, wired  # noqa: F401  (NotYours: what a refused call raises)


@dataclass(frozen=True)
class OwnCall:
    """numformer's own backward for the exercise, used by the student's code: called from ``file`` at ``line``
    (None: no line of the student's on the stack: a torch hook, a property's result called by the grader), or
    (``how`` "is") the student's function resolves to numformer's itself, ``line`` where it is made. ``how``: "call"
    (on the grading thread), "thread" (from another thread; ``detail`` its name), "is", "process" (a process
    started, where no watch reaches; ``detail`` its command, ``callee`` None) or "exec" (numformer's source run
    through exec)."""

    callee: str | None  # its dotted name: "numformer.layers.layernorm.layernorm_backward"
    file: str | None    # the student's file (or the helper beside it) the call is made from
    line: int | None
    how: str = "call"
    detail: str | None = None

    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}" if self.file and self.line else f"thread {self.detail!r}"

    def __str__(self) -> str:
        return describe([self])


def describe(calls) -> str:
    """One line for the grade, after "NOT YOURS: ": the first of ``calls`` (``calls numformer's own
    numformer.layers.layernorm.layernorm_backward (my_layernorm.py:81)``) and how many more there are."""
    first, n = calls[0], len(calls) - 1
    more = f" (and {n} more use{'s' if n != 1 else ''})" if n else ""
    at = f" ({Path(first.file).name}:{first.line})" if first.file and first.line else ""
    if first.how == "thread":
        return f"calls numformer's own {first.callee} from a thread ({first.where()}){more}"
    if first.how == "process":
        return f"starts a process ({first.detail}; {first.where()}), whose work the grading cannot see{more}"
    if first.how == "exec":
        return f"runs numformer's own {first.callee} from its source through exec ({first.where()}){more}"
    if first.how == "is":
        return f"is numformer's own {first.callee}{first.detail or ', assigned instead of written'}{at}{more}"
    if not at:
        return f"has numformer's own {first.callee} called while it runs, from no line of its own (a hook, a " \
               f"callback?){more}"
    return f"calls numformer's own {first.callee}{at}{more}"


def _unwrapped(fn):
    """The function as written, through what only forwards to it: staticmethod and classmethod,
    functools.partial and functools.wraps (``__wrapped__``), a bound method, and kernel()'s switch (``fast``)."""
    for _ in range(20):  # a chain longer than that is not a chain of wrappers
        if isinstance(fn, (staticmethod, classmethod)) or inspect.ismethod(fn):
            fn = fn.__func__
        elif isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        elif callable(getattr(fn, "fast", None)) and not isinstance(fn, type):
            fn = fn.fast
        else:
            break
    return fn


def numformer_backward_functions(ex) -> dict:
    """{function: dotted name} of what a student's backward for ``ex`` must not use: numformer's reference (a
    method's own function) and its fast twins."""
    from numformer.kernels import fast_twin  # noqa: PLC0415  (loads the kernel files: only when grading)

    functions = {_unwrapped(ex.target): ex.reference_name}
    twin = fast_twin(ex.target)
    if twin is not None:
        twin = _unwrapped(twin)
        functions[twin] = f"{twin.__module__}.{twin.__qualname__}"
    return functions


def numformer_backward_names(ex) -> dict:
    """{code object as written: dotted name} of :func:`numformer_backward_functions` (a trip wire on or not)."""
    return {original_code(fn): name for fn, name in numformer_backward_functions(ex).items()}


def _resolved(ex, answer):
    """(what the grader will call for ``ex`` out of ``answer``, how it got there: None, or ", a property ..." and the
    line): the function itself, their class's attribute resolved as an instance's (a ``@property`` or any
    descriptor is run, its getter's result taken), or the function their ``using(...)`` class calls
    (``train.py --swap``'s class)."""
    if not isinstance(answer, type):
        return answer, None
    if not ex.is_method:
        return getattr(answer, "using", {}).get(ex.target.__name__), None
    name = ex.target.__name__
    attribute = inspect.getattr_static(answer, name, None)
    if attribute is None or inspect.isfunction(attribute) or isinstance(attribute, (staticmethod, classmethod)):
        return attribute, None
    getter = getattr(attribute, "fget", None) or getattr(type(attribute), "__get__", None)
    how = f", returned by the {type(attribute).__name__} {name}", getattr(getattr(getter, "__code__", None),
                                                                          "co_firstlineno", None)
    try:  # the descriptor as the grader's call will see it: on an instance (made without __init__)
        return attribute.__get__(object.__new__(answer), answer), how
    except Exception:  # noqa: BLE001  (a getter that needs a built layer: its call is refused by the wires)
        return None, None


def reexported(ex, answer, file=None) -> OwnCall | None:
    """An :class:`OwnCall` (``how`` "is") when what the grader calls for ``ex`` is numformer's own (assigned,
    wrapped in something that only forwards to it, or given by a descriptor), or when the answer's module holds a
    copy of it (a new function object on numformer's code, which no trip wire is on); else None."""
    fn, how = _resolved(ex, answer)
    fn = _unwrapped(fn)
    # identity, not ==: code objects compare by content, and a copy of numformer's source at the same line
    # numbers (written, not assigned) would compare equal
    names = {id(c): n for c, n in numformer_backward_names(ex).items()}
    where = None if file is None else str(file)
    name = names.get(id(original_code(fn))) if hasattr(fn, "__code__") else None  # as written, wired or not
    if name is not None:
        detail, line = how if how is not None else (None, None)
        return OwnCall(name, where, line, "is", detail)
    functions = set(numformer_backward_functions(ex))
    held = getattr(_unwrapped(answer if not isinstance(answer, type) else fn), "__globals__", None) or {}
    for value in list(held.values()):
        if isinstance(value, types.FunctionType) and value not in functions and id(value.__code__) in names:
            return OwnCall(names[id(value.__code__)], where, None, "is", f", copied as {value.__name__}")
    return None


def _beside(file):
    """A predicate on a code object's file name: the student's ``file``, or a file in its folder (None: no
    file is the student's)."""
    if file is None:
        return lambda name: False
    target = os.path.realpath(file)
    folder = os.path.dirname(target)
    seen = {}

    def theirs(name: str) -> bool:
        if name not in seen:  # realpath is a few system calls: once per file name, not once per call
            real = os.path.realpath(name)
            seen[name] = real == target or os.path.dirname(real) == folder
        return seen[name]
    return theirs


@contextlib.contextmanager
def watch(ex, file, answer=None, whose=None):
    """``with watch(ex, file, answer) as calls:`` run the student's code for ``ex`` (from ``file``): numformer's own
    backward for ``ex`` refuses to run in the block (grad_checks/trip_wires.py), and ``calls`` then holds an
    :class:`OwnCall` for each distinct use of it: :func:`reexported` first (when ``answer`` is given), then each
    refused call, process and exec, in the order first made.

    ``whose``: whether a caller's file name is the student's (default: ``file`` and the files beside it; with
    ``file`` None, none is, and a refused call has no line)."""
    theirs = whose or _beside(file)
    calls, seen = [], set()
    own = None if answer is None else reexported(ex, answer, file)
    if own is not None:
        calls.append(own)

    def record(callee, frame, how, detail):
        where = (None, None) if frame is None else (frame.f_code.co_filename, frame.f_lineno)
        key = (callee, *where, how, None if frame is not None else detail)
        if key not in seen:
            seen.add(key)
            calls.append(OwnCall(callee, *where, how, detail))

    with wired(numformer_backward_functions(ex), record, theirs):
        yield calls


def calls_to_numformer(ex, run, file, answer=None) -> list:
    """:func:`watch` around ``run()`` (a function of no arguments that runs the student's code): the list of
    :class:`OwnCall`. A refused call's :class:`NotYours` stops ``run`` there."""
    with watch(ex, file, answer) as calls:
        try:
            run()
        except NotYours:
            pass
    return calls
