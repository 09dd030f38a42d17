"""Trip wires: while a student's code is graded, numformer's own backward for the exercise refuses to run, whoever
calls it; a process the code starts, or numformer's source run through ``exec``, is reported.

* **Refused, whoever calls.** While a watch is on (grad_checks/own_code.py), numformer's backward for the exercise and
  its fast twin *are* trip wires: the function's code is swapped for a forwarder (under numformer's file name and at
  its line: ``inspect.getsource`` still finds the source; a method's ``__class__`` cell kept) that reports the call
  and raises :class:`NotYours`. A name imported before is the same function object, so every route reaches the wire:
  the student's line, a thread or a pool, a torch tensor hook run by ``out.backward()``, ``functools.partial``, a
  descriptor or ``@property`` whose result the grader calls, a C extension's callback. Only a code object the grader
  :func:`permit` s calls it (the output guard, grad_checks/exercise.py, after the student's function has returned).
  Each refusal is reported at the nearest line of the student's files on the calling thread's stack, if any.
* **Processes.** One started from the student's code (``subprocess``, ``os.system``, ``os.exec*``,
  ``os.posix_spawn``, ``os.fork``: ``multiprocessing`` goes through them) computes where no wire reaches: named.
* **exec.** Code run through ``exec``/``eval`` from the student's code that holds numformer's backward (its bytecode,
  names and constants: numformer's source read and run) is named; an import (importlib executing a module) is not.

The last two use an audit hook (``sys.addaudithook``, PEP 578), added once per process and idle while no watch is on.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import sys
import threading
import types

_WATCHES: list = []            # the watches on now (innermost last): each a _Wires
_HOOK_ADDED = False
_ORIGINAL_CODE: dict = {}      # id(function) -> its code as written, while a wire is on it
_PERMITTED: set = set()        # the grader's code objects whose calls of a wired function run
_KEYS = itertools.count()
PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}


class NotYours(RuntimeError):
    """Raised in the student's code by numformer's own backward for the exercise, which refuses to run there."""


def permit(code) -> None:
    """Calls of a wired function made directly from ``code`` (a code object of the grader's) run as usual."""
    _PERMITTED.add(code)


def original_code(fn):
    """``fn``'s code as written, whether or not a wire is on it now."""
    return _ORIGINAL_CODE.get(id(fn), fn.__code__)


class _Wires:
    """One watch: where it reports (``record(callee, frame_or_None, how, detail)``), whether a file is the
    student's (``theirs``), the code of what it watches as written ({code: dotted name}), its grading thread."""

    def __init__(self, record, theirs, references: dict):
        self.record, self.theirs, self.references = record, theirs, references
        self.thread = threading.current_thread()

    def student_frame(self, frame):
        """The nearest frame of the student's files at or above ``frame`` (None: none)."""
        while frame is not None and not self.theirs(frame.f_code.co_filename):
            frame = frame.f_back
        return frame


def _tripped(callee: str, frame) -> None:
    """A wired function was called from ``frame``: unless the grader permits that caller, every watch records the
    use and the call is refused."""
    if frame.f_code in _PERMITTED or not _WATCHES:
        return
    here = threading.current_thread()
    for wires in list(_WATCHES):
        theirs = here is wires.thread
        wires.record(callee, wires.student_frame(frame), "call" if theirs else "thread", None if theirs else here.name)
    raise NotYours(f"numformer's own {callee} refuses to run while your code is graded: the exercise is to write it")


def _wire(fn, callee: str):
    """Swap ``fn``'s code for a forwarder that trips (see :func:`_tripped`) and then runs the original; returns the
    undo, or None for what is not a Python function."""
    if not isinstance(fn, types.FunctionType):
        return None
    code = fn.__code__
    original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    original.__kwdefaults__ = fn.__kwdefaults__
    key = f"__grad_checks_trip_wire_{next(_KEYS)}"
    params, passed = _parameters(code)
    free = code.co_freevars  # a method using super() has a __class__ cell: the forwarder has the same free names
    pad = "    " * (2 if free else 1)
    source = (f"def {code.co_name}({params}):\n"
              + (f"{pad}if False: ({', '.join(free)},)\n" if free else "")
              + f"{pad}{key}[0]({callee!r}, __import__('sys')._getframe(1))\n{pad}return {key}[1]({passed})\n")
    if free:  # the free names as the parameters of a function around it, which makes them cells
        source = f"def __nf_outer__({', '.join(free)}):\n" + "".join("    " + line + "\n" for line in source.splitlines())
    # at the original's line: inspect.getsource still finds numformer's source
    compiled = compile("\n" * max(code.co_firstlineno - 1 - bool(free), 0) + source, code.co_filename, "exec")
    for _ in range(1 + bool(free)):
        compiled = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    forwarder = compiled.replace(co_freevars=free) if free else compiled
    fn.__globals__[key] = (_tripped, original)
    _ORIGINAL_CODE.setdefault(id(fn), code)
    fn.__code__ = forwarder

    def undo():
        fn.__code__ = code
        fn.__globals__.pop(key, None)
        if code is _ORIGINAL_CODE.get(id(fn)):
            del _ORIGINAL_CODE[id(fn)]
    return undo


def _parameters(code) -> tuple[str, str]:
    """(the parameter list of ``code``'s function, the arguments that pass each on): ``a, /, b, *c, d, **e`` and
    ``a, b, *c, d=d, **e``. The defaults stay the function's own (``__defaults__``, ``__kwdefaults__``)."""
    names = code.co_varnames
    n, posonly, kwonly = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    star = bool(code.co_flags & inspect.CO_VARARGS)
    starstar = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    params, passed = list(names[:n]), list(names[:n])
    if posonly:
        params.insert(posonly, "/")
    rest = names[n:n + kwonly]
    if star:
        params.append("*" + names[n + kwonly])
        passed.append("*" + names[n + kwonly])
    elif rest:
        params.append("*")
    params += rest
    passed += [f"{k}={k}" for k in rest]
    if starstar:
        params.append("**" + names[n + kwonly + star])
        passed.append("**" + names[n + kwonly + star])
    return ", ".join(params), ", ".join(passed)


def _same_code(a, b) -> bool:
    """The same function compiled from the same source: bytecode, names and non-code constants."""
    consts = lambda c: tuple(x for x in c.co_consts if not isinstance(x, types.CodeType))  # noqa: E731
    return (a.co_name == b.co_name and a.co_code == b.co_code and a.co_names == b.co_names
            and consts(a) == consts(b))


def _holds(code, references):
    """The dotted name of the first of ``references`` ({code: name}) that ``code`` holds, at any depth."""
    stack = [code]
    while stack:
        c = stack.pop()
        for ref, name in references.items():
            if _same_code(c, ref):
                return name
        stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
    return None


def _importing(frame, stop) -> bool:
    """Whether importlib runs between ``frame`` and the student's frame ``stop``: the module code it executes is an
    import, not an exec of the student's."""
    while frame is not None and frame is not stop:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _command(event: str, args) -> str:
    """The command a process event runs, shortened for one line."""
    if event == "os.fork":
        return "a fork of the grading process"
    argv = args[1] if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn") else args[0]
    text = " ".join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv)
    return text if len(text) <= 60 else text[:57] + "..."


def _audit(event: str, args) -> None:
    if not _WATCHES or (event not in PROCESS_EVENTS and event != "exec"):
        return
    caller = sys._getframe(1)
    for wires in list(_WATCHES):
        frame = wires.student_frame(caller)
        if frame is None:  # not the student's code: the grader, numformer, the test harness
            continue
        if event == "exec":
            code = args[0]
            if not isinstance(code, types.CodeType) or _importing(caller, frame):
                continue
            name = _holds(code, wires.references)
            if name is not None:
                wires.record(name, frame, "exec", None)
        else:
            wires.record(None, frame, "process", _command(event, args))


@contextlib.contextmanager
def wired(functions: dict, record, theirs):
    """While the block runs: ``functions`` ({function object: dotted name}, numformer's backward for the exercise
    and its fast twin) refuse to run unless the grader permits the caller (:func:`permit`), and processes and
    exec's started from the student's code (``theirs``: a predicate on a file name) are reported.
    ``record(callee, frame, how, detail)``: ``frame`` the student's frame the use was made from (or None)."""
    global _HOOK_ADDED
    wires = _Wires(record, theirs, {original_code(fn): name for fn, name in functions.items()})
    if not _HOOK_ADDED:
        sys.addaudithook(_audit)
        _HOOK_ADDED = True
    undos = [u for u in (_wire(fn, name) for fn, name in functions.items()) if u is not None]
    previous_hook = threading.excepthook

    def quiet(args):  # a thread of the student's stopped by a refusal: recorded, not printed as a traceback
        if not isinstance(args.exc_value, NotYours):
            previous_hook(args)
    threading.excepthook = quiet
    _WATCHES.append(wires)
    try:
        yield
    finally:
        _WATCHES.remove(wires)
        threading.excepthook = previous_hook
        for undo in reversed(undos):
            undo()
