"""Student code under a clock: each case of a student's code gets a time limit, and one that does not return
in time stops the grading with one line saying which case and where in the student's file it was.

A backward with an endless loop (``while True``, a loop whose index never advances) would otherwise make
``python -m grad_checks check FILE`` (and ``exercise --status DIR``, and ``train.py --swap``'s grading) run
forever, printing nothing. Every run of a student's code (importing the file, building the layers, each case
forward and backward, each case's finite differences) is wrapped in :class:`deadline`: at the deadline it
raises :class:`StudentCodeTimeout`, a :class:`~numformer.errors.UsageError` (exit status 2, the student's
mistake), whose message is the one line::

    case 2 of 3 (padded batch) did not return within 10 s: stopped at lab/my_layernorm.py:81 in
    layernorm_backward (an endless loop?): fix it, or give it longer with --time-limit SECONDS (0: no limit)

The limit is :data:`DEFAULT_TIME_LIMIT` per case: ten times the slowest right answer. The slowest case of
every exercise, numformer's own backward written in as the student's file, takes under a second on a 2-core
machine (the decoder layer's finite differences, 0.96 s; every other case under 0.7 s), so 10 s leaves a right
answer on a loaded machine a margin of 10x, and an endless loop is named within seconds instead of after a
silent minute (the limit was 60 s until a student took that minute for a hang). A right but slow backward
(Python loops over the entries) may need ``--time-limit``: the line says so.

How the clock stops the code: SIGALRM in the main thread (``signal.setitimer``). A student's backward is pure
Python and NumPy, so the interpreter reaches a bytecode boundary within microseconds of the signal, and the
handler runs there, *in the student's frame*: it reads the stack it interrupted (the deepest frame in the
student's file is the line to name) and raises there, unwinding the student's code like any exception.
Nothing is left behind: no thread, no process, the previous handler and timer restored. A watchdog thread
could read the main thread's stack (``sys._current_frames()``) but has no safe way to stop it; a process per
case would pay NumPy's import and a pickled layer on every case. Code that catches that exception too (a
bare ``except:`` inside its endless loop) is stopped again each second; if it is still running
:data:`GIVE_UP` seconds after the deadline, nothing raised inside it can end it, and the process ends there:
the same one line on stderr, exit status 2 (``os._exit``, the one way out it cannot catch; only for such
code, whoever runs the grading). Where SIGALRM cannot be used (Windows, or grading run outside the main
thread, where Python lets no signal handler be set) the code runs without a limit, as it did before.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from numformer.errors import UsageError
from numformer.user_code import library_dirs
from numformer.user_code_exits import REAL_EXIT

DEFAULT_TIME_LIMIT = 10.0  # seconds per case: 10x the slowest right answer (the module docstring)
ADVICE = "fix it, or give it longer with --time-limit SECONDS (0: no limit)"
_AGAIN = 1.0  # after the deadline the alarm repeats every second: code that swallowed the first one is stopped again
GIVE_UP = 3.0  # seconds after the deadline: code still running has caught every stop, and the process ends


class StudentCodeTimeout(UsageError):
    """A case of a student's code did not return within the time limit; the message is one line naming the
    case and the file:line it was executing. ``case``, ``seconds``, ``where`` and ``file`` (the student's) are
    kept for callers that word their own line (``train.py --swap``'s grading)."""

    def __init__(self, case: str, seconds: float, where: str, file=None, advice: str = ADVICE):
        self.case, self.seconds, self.where, self.file = case, seconds, where, file
        super().__init__(f"{self.stopped()}: {advice}")

    def stopped(self) -> str:
        """``case 2 of 3 (padded batch) did not return within 10 s: stopped at FILE:LINE in NAME (...)``."""
        return (f"{self.case} did not return within {self.seconds:g} s: stopped at {self.where} "
                "(an endless loop?)")


class _Deadline(BaseException):
    """Raised by the alarm inside the student's code. A BaseException, not an Exception: the grading records
    whatever a student's code raises as the case's outcome (``except Exception``), and this must get through
    to :class:`deadline`, which turns it into :class:`StudentCodeTimeout`."""


def _frame_in(frame, file) -> str:
    """``FILE:LINE in NAME`` of the deepest frame of the interrupted stack in the student's ``file`` (the path
    as the student gave it); else of the deepest frame outside numformer, grad_checks, NumPy and the standard
    library (a helper module of the student's); else the deepest frame."""
    stack = []
    while frame is not None:  # innermost first
        stack.append(frame)
        frame = frame.f_back
    if not stack:
        return "?"
    if file is not None:
        target = Path(file).resolve()
        for f in stack:
            if Path(f.f_code.co_filename).resolve() == target:
                return f"{file}:{f.f_lineno} in {f.f_code.co_name}"
    library = library_dirs()
    chosen = next((f for f in stack if not str(Path(f.f_code.co_filename).resolve()).startswith(library)), stack[0])
    return f"{chosen.f_code.co_filename}:{chosen.f_lineno} in {chosen.f_code.co_name}"


def can_stop() -> bool:
    """Whether the clock can stop code here: SIGALRM exists (Unix) and this is the main thread (the only one
    Python runs signal handlers in, and lets set them)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class deadline:  # noqa: N801  (used as a context manager, named like one)
    """``with deadline(seconds, "case 2 of 3 (padded batch)", file):`` runs the block with a deadline.

    ``advice``: what the line tells the student to do (the default names ``--time-limit``, which the
    grading commands take). ``seconds`` None or 0: no limit (to step through the code in a debugger, say). At the deadline the block
    is stopped where it is and :class:`StudentCodeTimeout` is raised from the ``with``; ``file`` is the
    student's file, whose line the message names. Not reentrant (one clock at a time; grading never nests
    them).
    """

    def __init__(self, seconds: float | None, case: str, file=None, advice: str = ADVICE):
        self.seconds, self.case, self.file, self.advice = seconds, case, file, advice
        self.armed = False
        self.where = None

    def __enter__(self):
        if not self.seconds or not can_stop():
            return self
        self.previous_handler = signal.signal(signal.SIGALRM, self._alarm)
        self.started = time.monotonic()
        self.previous_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, _AGAIN)
        self.armed = True
        return self

    def _alarm(self, signum, frame):
        if frame is not None and frame.f_code is deadline.__exit__.__code__:
            return  # the block has returned and __exit__ is disarming the clock: nothing to stop
        self.where = _frame_in(frame, self.file)
        if time.monotonic() - self.started >= self.seconds + GIVE_UP - _AGAIN / 2:
            _end_process(StudentCodeTimeout(self.case, self.seconds, self.where, self.file, self.advice))
        raise _Deadline

    def __exit__(self, kind, exc, tb):
        if not self.armed:
            return False
        signal.setitimer(signal.ITIMER_REAL, 0)  # first: no alarm may fire outside the block
        self.armed = False
        signal.signal(signal.SIGALRM, self.previous_handler if self.previous_handler is not None else signal.SIG_DFL)
        left, interval = self.previous_timer
        if left > 0:  # someone else's timer was running: it goes on, less the time spent here
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - self.started), 1e-3), interval)
        if isinstance(exc, _Deadline):
            raise StudentCodeTimeout(self.case, self.seconds, self.where or "?", self.file, self.advice) from None
        return False


def _prog() -> str:
    """The command's name as its one-line errors start: ``python -m grad_checks``, ``train.py``."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return f"python -m {script.parent.name}" if script.name == "__main__.py" else script.name


def _end_process(error: StudentCodeTimeout) -> None:
    """The last resort for code that catches every exception raised in it: the one line, exit status 2."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110  (a closed stream: the line below is what matters)
            pass
    os.write(2, f"{_prog()}: error: {error}\n".encode("utf-8", "replace"))
    REAL_EXIT(error.exit_code)  # the real one: inside a user_code_exits block os._exit is the code's trap

