"""Trip wires: numformer's own backward reached by a student's code where the grading thread's profiler
(grad_checks/own_code.py's :func:`~grad_checks.own_code.watch`) cannot see it: from another thread, from a
process the code starts, or by running numformer's source through ``exec``. Each use found is an
:class:`~grad_checks.own_code.OwnCall`, and the grade says NOT YOURS, never EXACT.

* **Any thread.** While a watch is on, numformer's backward for the exercise and its fast twin *are* trip
  wires: the function object's code is swapped for a two-line forwarder (compiled under numformer's file
  name, so the frames it adds read as numformer's and the caller is still the student's) that reports the
  call and runs the original code. A name the student imported before (``from numformer.layers.layernorm
  import layernorm_backward``) is the same function object, so a call through it, from any thread,
  numformer's own thread pool included, is seen. The grading thread's calls are left to the profiler (it
  tells the grader's own reference runs from the student's); a call from any other thread counts, at the
  nearest line of the student's files on that thread's stack, else by the thread's name. A method
  (``MultiHeadAttention.backward`` calls ``super()``, a closure Python cannot swap code under) is watched in
  the threads started during the watch instead (``threading.setprofile``).
* **Processes.** A process started from the student's code (``subprocess``, ``os.system``, ``os.exec*``,
  ``os.posix_spawn``, ``os.fork``: ``multiprocessing`` goes through them) computes where no wire reaches:
  named, with its command, as not the student's work.
* **exec.** Code run through ``exec``/``eval`` from the student's code that holds numformer's backward (the
  same bytecode, names and constants as the reference's: the source of numformer's file read and run) is
  named. Code the student typed into their own file is theirs, as own_code.py says; an import (numformer's
  modules are executed by importlib the first time) is not an ``exec`` of the student's.

The last two use an audit hook (``sys.addaudithook``, PEP 578): Python has no way to remove one, so one is
added per process, the first time a watch starts, and it returns at once while no watch is on.
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
_KEYS = itertools.count()
PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}


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


def _report_thread_call(callee: str, frame) -> None:
    """A wired function was called: report it to every watch whose grading thread this is not."""
    here = threading.current_thread()
    for wires in list(_WATCHES):
        if here is not wires.thread:
            wires.record(callee, wires.student_frame(frame), "thread", here.name)


def _wire(fn, callee: str):
    """Swap ``fn``'s code for a forwarder that reports each call and runs the original; returns the undo, or
    None for a function Python cannot swap (a closure: ``super()`` in a method)."""
    code = fn.__code__
    if code.co_freevars or not isinstance(fn, types.FunctionType):
        return None
    original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__)
    original.__kwdefaults__ = fn.__kwdefaults__
    key = f"__grad_checks_trip_wire_{next(_KEYS)}"
    # compiled under numformer's file name: the frame it adds reads as numformer's, which passes calls on;
    # with the original's parameters (what the output guard and inspect.signature read), passed on by name
    params, passed = _parameters(code)
    source = ("\n" * (code.co_firstlineno - 1)  # at the original's line: inspect.getsource still finds its source
              + f"def {code.co_name}({params}):\n"
              f"    {key}[0]({callee!r}, __import__('sys')._getframe(1))\n"
              f"    return {key}[1]({passed})\n")
    forwarder = next(c for c in compile(source, code.co_filename, "exec").co_consts
                     if isinstance(c, types.CodeType))
    fn.__globals__[key] = (_report_thread_call, original)
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
def wired(functions: dict, record, theirs, profile):
    """While the block runs: ``functions`` ({function object: dotted name}, numformer's backward for the
    exercise and its fast twin) are trip wires for every thread but this one, the threads started in the
    block get ``profile`` (the watch's own profiler, for what cannot be wired), and processes and exec's
    started from the student's code (``theirs``: a predicate on a file name) are reported.
    ``record(callee, frame, how, detail)``: ``frame`` the student's frame the use was made from (or None)."""
    global _HOOK_ADDED
    wires = _Wires(record, theirs, {original_code(fn): name for fn, name in functions.items()})
    if not _HOOK_ADDED:
        sys.addaudithook(_audit)
        _HOOK_ADDED = True
    undos = [u for u in (_wire(fn, name) for fn, name in functions.items()) if u is not None]
    previous_profile = threading.getprofile()
    threading.setprofile(profile)
    _WATCHES.append(wires)
    try:
        yield
    finally:
        _WATCHES.remove(wires)
        threading.setprofile(previous_profile)
        for undo in reversed(undos):
            undo()
