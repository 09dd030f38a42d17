"""Whether a student's backward is their own: one that hands the work to numformer's own backward for the
exercise grades EXACT, since it *is* numformer's; this finds such code, so that the grading can say so.

What counts is numformer's function for the exercise (its reference, ``ex.target``: for a method, the method as
written) and the reference's fast twins (the kernels
registered under its dotted name, numformer/kernels/twins.py). Nothing else: a composite calling its children's
backward (``MultiHeadAttention.backward`` calling ``self.attention.backward``) or attention's backward calling
numformer's ``softmax_backward`` is the student using pieces the exercise does not ask for.

Two ways a student's code gets there:

* it *calls* one: :func:`watch`, around the run of the student's code, sees each call of those functions
  (``sys.setprofile``: Python 3.11 has no ``sys.monitoring``, and a profiler, unlike ``sys.settrace``, is not
  called for every line; the callback returns at once for any event but ``'call'``) and keeps those made from
  the student's file, or from a file beside it (a helper module it imports; ``load_file`` puts the folder on
  the path for that), with the line. The caller is the nearest frame outside numformer's package: a call
  through numformer's own code (``kernel(f)(...)`` through the switch of numformer/kernels/__init__.py, ``LayerNorm.backward`` through the
  layer) is made by whoever called numformer. The grader's own calls do not count: the output guard of
  grad_checks/exercise.py runs the reference on a copy of the arguments, from grad_checks, on every call of a
  student's function, so a detector that ignored the caller's file would call every answer numformer's.
* it *is* one: ``layernorm_backward = L.layernorm_backward`` (or ``backward = NumformerLayer.backward`` in the
  class) is then called by numformer's layer, from numformer's file, and no call is the student's:
  :func:`reexported` compares the answer's code object with numformer's.

The student's code runs on the grading thread, which the profiler watches; what it hands to another thread, a
process or ``exec`` is found by grad_checks/trip_wires.py (numformer's backward and its twin made trip wires for
every thread, an audit hook for processes and exec). A profiler installed before (cProfile, a Python profile function) is put back afterwards,
and a Python one still sees every event in between.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import threading

import numformer

from .trip_wires import original_code, wired


@dataclass(frozen=True)
class OwnCall:
    """numformer's own backward for the exercise, used by the student's code: called from ``file`` at ``line``,
    or (``line`` None, ``how`` "call") the student's function is numformer's itself. ``how``: "call" (on the
    grading thread), "thread" (from another thread; ``detail`` its name), "process" (a process started, where
    no watch reaches; ``detail`` its command, ``callee`` None) or "exec" (numformer's source run through exec):
    grad_checks/trip_wires.py finds the last three."""

    callee: str | None  # its dotted name: "numformer.layers.layernorm.layernorm_backward"
    file: str | None    # the student's file (or the helper beside it) the call is made from
    line: int | None
    how: str = "call"
    detail: str | None = None

    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}" if self.file and self.line else f"thread {self.detail!r}"

    def __str__(self) -> str:
        if self.how != "call":  # found by the trip wires: worded once, by describe
            return describe([self])
        where = Path(self.file).name if self.file else "the answer"
        if self.line is None:
            return f"numformer's {self.callee} itself ({where} assigns it instead of writing it)"
        return f"numformer's {self.callee} ({where}:{self.line})"


def describe(calls) -> str:
    """One line for the grade, after "NOT YOURS: ": the first of ``calls`` (``calls numformer's own
    numformer.layers.layernorm.layernorm_backward (my_layernorm.py:81)``) and how many more there are."""
    first, n = calls[0], len(calls) - 1
    more = f" (and {n} more use{'s' if n != 1 else ''})" if n else ""
    if first.how == "thread":
        return f"calls numformer's own {first.callee} from a thread ({first.where()}){more}"
    if first.how == "process":
        return f"starts a process ({first.detail}; {first.where()}), whose work the grading cannot see{more}"
    if first.how == "exec":
        return f"runs numformer's own {first.callee} from its source through exec ({first.where()}){more}"
    if first.line is None:
        return f"is numformer's own {first.callee}, assigned instead of written{more}"
    return f"calls numformer's own {first.callee} ({Path(first.file).name}:{first.line}){more}"


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


def _answer_function(ex, answer):
    """The student's function or method for ``ex`` out of ``answer``: the function itself, their class's own
    method (a composition), or the function their ``using(...)`` class calls (``train.py --swap``'s class)."""
    if not isinstance(answer, type):
        return answer
    if ex.is_method:
        return vars(answer).get(ex.target.__name__)
    return getattr(answer, "using", {}).get(ex.target.__name__)


def reexported(ex, answer, file=None) -> OwnCall | None:
    """An :class:`OwnCall` (line None) when the student's function for ``ex`` is numformer's own (assigned, or
    wrapped in something that only forwards to it), else None."""
    fn = _unwrapped(_answer_function(ex, answer))
    code = original_code(fn) if hasattr(fn, "__code__") else None  # as written, a trip wire on it or not
    # identity, not ==: code objects compare by content, and a copy of numformer's source at the same line
    # numbers (written, not assigned) would compare equal
    name = next((n for c, n in numformer_backward_names(ex).items() if c is code), None)
    return None if name is None else OwnCall(name, None if file is None else str(file), None)


_NUMFORMER = os.path.realpath(os.path.dirname(numformer.__file__)) + os.sep


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


def _in_numformer(name: str, cache: dict) -> bool:
    if name not in cache:
        cache[name] = os.path.realpath(name).startswith(_NUMFORMER)
    return cache[name]


@contextlib.contextmanager
def watch(ex, file, answer=None, whose=None):
    """``with watch(ex, file, answer) as calls:`` run the student's code for ``ex`` (from ``file``); ``calls`` then
    holds an :class:`OwnCall` for each distinct place their code uses numformer's own backward for ``ex``:
    :func:`reexported` first (when ``answer`` is given), then each call seen, in the order first made.

    ``whose``: whether a caller's file name is the student's (default: ``file`` and the files beside it; with
    ``file`` None, none is, and only :func:`reexported` can find anything). The previous profiler is restored
    on the way out, exception or not."""
    # by identity: a code object's hash is computed from its contents on every lookup, and a copy of the
    # reference's source (a student's) at the same line numbers would compare equal to it
    codes = {id(code): name for code, name in numformer_backward_names(ex).items()}
    theirs = whose or _beside(file)
    calls, seen, library = [], set(), {}
    own = None if answer is None else reexported(ex, answer, file)
    if own is not None:
        calls.append(own)
    previous = sys.getprofile()
    chain = previous if callable(previous) else None
    grading = threading.current_thread()

    def record(callee, frame, how, detail):
        where = (None, None) if frame is None else (frame.f_code.co_filename, frame.f_lineno)
        key = (callee, *where, how, None if frame is not None else detail)
        if key not in seen:
            seen.add(key)
            calls.append(OwnCall(callee, *where, how, detail))

    live = [True]  # False once the watch ends: a thread started in it then drops this profiler at its next event

    def profile(frame, event, arg):
        if not live[0]:
            sys.setprofile(None)  # (only another thread gets here: the grading thread's profiler is put back)
            return
        if event == "call":
            callee = codes.get(id(frame.f_code))
            if callee is not None:
                caller = frame.f_back
                while caller is not None and _in_numformer(caller.f_code.co_filename, library):
                    caller = caller.f_back  # numformer only passed the call on: its caller made it
                here = threading.current_thread()
                if here is not grading:  # a thread the student's code started (trip_wires.wired gives it this)
                    while caller is not None and not theirs(caller.f_code.co_filename):
                        caller = caller.f_back
                    record(callee, caller, "thread", here.name)
                elif caller is not None and theirs(caller.f_code.co_filename):
                    record(callee, caller, "call", None)
        if chain is not None and threading.current_thread() is grading:
            chain(frame, event, arg)

    sys.setprofile(profile)
    try:
        with wired(numformer_backward_functions(ex), record, theirs, profile):
            yield calls
    finally:
        live[0] = False
        if previous is not None and not callable(previous) and hasattr(previous, "enable"):
            sys.setprofile(None)
            previous.enable()  # cProfile: sys.getprofile gives its object, which re-installs its C hook itself
        else:
            sys.setprofile(previous)


def calls_to_numformer(ex, run, file, answer=None) -> list:
    """:func:`watch` around ``run()`` (a function of no arguments that runs the student's code): the list of
    :class:`OwnCall`."""
    with watch(ex, file, answer) as calls:
        run()
    return calls
