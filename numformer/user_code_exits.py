"""A user's code kept from leaving by another door: run inside :func:`contained`, code that ends the process,
forks it, leaves a thread running, raises KeyboardInterrupt of its own or changes the working directory is
named in one line as what the file did, and the process that grades it goes on to say so.

The grader (``python -m grad_checks check FILE``, ``exercise --status DIR``) and ``train.py --swap`` import a
user's file and call its code. A call may return or raise; the grading handles both. These are the other
ways out, each of which once passed for a grade or lost it (issue 68):

* **an exit**: ``sys.exit(0)`` at import printed nothing and exited 0, an ungraded file "passing";
  ``os._exit(0)`` the same, with no exception to catch. ``SystemExit`` is caught where it leaves the code, and
  ``os._exit`` is replaced, for as long as the code runs, by one that raises instead;
* **a fork**: both processes went on grading, so the grade was printed twice. ``os.fork`` is replaced the same
  way (``multiprocessing`` forks through it); a fork made past that (``posix.fork``) is seen by a fork hook, and
  its child ends at once, before it can print anything;
* **a thread left running**: a non-daemon thread the code started and did not end kept the process from exiting
  after it had printed EXACT. A thread the code starts is made a daemon before it starts (so nothing waits for
  it) and, still running when the code returns, named;
* **a KeyboardInterrupt of its own**: reported as the user's Ctrl-C (exit 130). A Ctrl-C pressed at the
  terminal arrives as SIGINT, which :func:`contained` watches for: a KeyboardInterrupt with no SIGINT behind it
  is the code's;
* **a changed working directory**: the grading's relative paths then pointed elsewhere (a bug report). The
  directory is put back, and the change named.

What the code did is a :class:`UserCodeLeft`, a :class:`~numformer.user_code.UserCodeError` (one line, the
file's mistake: graded ERROR, never a pass). The patched functions are put back when the block ends. One
block at a time (grading never nests them; a nested block is the outer one's).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from .errors import Stopped
from .user_code import UserCodeError, library_dirs

# The functions replaced while a user's code runs, as they are (what numformer itself calls meanwhile: the clock's
# last resort for code that catches every exception ends the process with the real os._exit).
REAL_EXIT, REAL_FORK, REAL_CHDIR, REAL_FCHDIR = os._exit, os.fork, os.chdir, os.fchdir
REAL_THREAD_START = threading.Thread.start

_ACTIVE: list = []         # the block running now (at most one)
_FORK_HOOK_ADDED = False   # os.register_at_fork has no way to remove a hook: one per process, idle outside a block


class UserCodeLeft(UserCodeError):
    """The user's code left by another door than a return or an exception (an exit, a fork, a thread left
    running, a KeyboardInterrupt of its own, a changed working directory): the message is one line naming
    what it did and where. ``what`` and ``where`` are kept for callers that word their own line."""

    def __init__(self, what: str, where: str, doing: str, file):
        self.what, self.where, self.file = what, where, file
        at = f" (at {where})" if where else ""
        super().__init__(f"{Path(file).name} {what} {doing}{at}: graded ERROR: a file to grade defines its "
                         "functions and classes and returns from each call; remove that")


class _Door(BaseException):
    """Raised inside the user's code by a replaced ``os._exit`` or ``os.fork``. A BaseException, so that the
    grading's ``except Exception`` (which records what a case raised) lets it through to :func:`contained`."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _user_frame(frame, file):
    """The nearest frame at or above ``frame`` in the user's ``file``, else in code outside numformer,
    grad_checks, NumPy and the standard library (a helper module of the user's); None when there is none."""
    target = str(Path(file).resolve()) if file is not None else None
    library = library_dirs()
    outside = None
    while frame is not None:
        name = frame.f_code.co_filename
        resolved = str(Path(name).resolve()) if not name.startswith("<") else name
        if resolved == target:
            return frame
        if outside is None and not name.startswith("<") and not resolved.startswith(library):
            outside = frame
        frame = frame.f_back
    return outside


def _at(frame) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else ""


class _Block:
    def __init__(self, file, doing: str):
        self.file, self.doing = Path(file), doing
        self.signalled = False        # a SIGINT arrived while the code ran: a KeyboardInterrupt then is the user's
        self.threads: list = []       # (thread, where) the code started, made daemons
        self.chdir_at = ""            # where the code changed the working directory
        self.forked_at = None         # a fork seen by the fork hook (past the replaced os.fork)
        self.moved_to = None          # the working directory the code left (put back after it)

    # -- the replaced doors ----------------------------------------------------------------------------------
    def exit(self, code=0):
        raise _Door(f"called os._exit({code})")

    def fork(self):
        raise _Door("forked the process (os.fork)")

    def forkpty(self):
        raise _Door("forked the process (os.forkpty)")

    def chdir(self, path):
        self.chdir_at = self.chdir_at or _at(_user_frame(sys._getframe(1), self.file))
        return REAL_CHDIR(path)

    def fchdir(self, fd):
        self.chdir_at = self.chdir_at or _at(_user_frame(sys._getframe(1), self.file))
        return REAL_FCHDIR(fd)

    def start(self, thread):
        frame = _user_frame(sys._getframe(1), self.file)
        if frame is not None and not thread.daemon:  # the user's: nothing may wait for it at exit
            thread.daemon = True
            self.threads.append((thread, _at(frame)))
        return REAL_THREAD_START(thread)

    def sigint(self, signum, frame):
        handler = self.previous_sigint
        if handler is signal.SIG_IGN:  # the command runs with Ctrl-C ignored (nohup, a background job): still so
            return None
        self.signalled = True
        if callable(handler):
            return handler(signum, frame)
        raise KeyboardInterrupt

    # -- entering and leaving -----------------------------------------------------------------------------------
    def __enter__(self):
        global _FORK_HOOK_ADDED
        if not _FORK_HOOK_ADDED and hasattr(os, "register_at_fork"):
            os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
            _FORK_HOOK_ADDED = True
        self.cwd = os.getcwd()
        self.previous_sigint = None
        if threading.current_thread() is threading.main_thread():
            self.previous_sigint = signal.signal(signal.SIGINT, self.sigint)
        os._exit, os.fork, os.chdir, os.fchdir = self.exit, self.fork, self.chdir, self.fchdir
        if hasattr(os, "forkpty"):
            self.real_forkpty, os.forkpty = os.forkpty, self.forkpty
        threading.Thread.start = lambda thread: self.start(thread)
        _ACTIVE.append(self)
        return self

    def put_back(self):
        try:
            self.moved_to = os.getcwd()
        except OSError:  # the code removed the folder it moved into
            self.moved_to = "a folder since removed"
        _ACTIVE.remove(self)
        os._exit, os.fork, os.chdir, os.fchdir = REAL_EXIT, REAL_FORK, REAL_CHDIR, REAL_FCHDIR
        if hasattr(os, "forkpty"):
            os.forkpty = self.real_forkpty
        threading.Thread.start = REAL_THREAD_START
        if self.previous_sigint is not None:
            signal.signal(signal.SIGINT, self.previous_sigint)
        moved = self.moved_to != self.cwd
        if moved:
            REAL_CHDIR(self.cwd)  # the grading's paths are relative to where the command started
        return moved

    def left(self, exc) -> UserCodeLeft | None:
        """What the code did, from the exception leaving the block (None: nothing of the kinds above)."""
        where = lambda e: _at(_user_frame(_innermost(e), self.file))  # noqa: E731
        if isinstance(exc, SystemExit):
            code = exc.code
            return self._said(f"called sys.exit({'' if code is None else repr(code)})", where(exc))
        if isinstance(exc, _Door):
            return self._said(exc.what, where(exc))
        if isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Stopped) and not self.signalled:
            return self._said("raised KeyboardInterrupt", where(exc))
        return None

    def after(self, moved: bool) -> UserCodeLeft | None:
        """What the code left behind when it returned: a fork past the replaced os.fork, a thread still running,
        the working directory changed."""
        if self.forked_at is not None:
            return self._said("forked the process", self.forked_at)
        running = [(t, at) for t, at in self.threads if t.is_alive()]
        if running:
            thread, at = running[0]
            more = f" and {len(running) - 1} more" if len(running) > 1 else ""
            return self._said(f"started a thread ({thread.name}{more}) that was still running when the code "
                              "returned", at)
        if moved:
            return self._said(f"changed the working directory (to {self.moved_to})", self.chdir_at)
        return None

    def _said(self, what: str, where: str) -> UserCodeLeft:
        return UserCodeLeft(what, where, self.doing, self.file)


def _innermost(exc: BaseException):
    """The innermost frame of ``exc``'s traceback (where it was raised)."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


def _before_fork():
    if _ACTIVE:
        block = _ACTIVE[-1]
        block.forked_at = block.forked_at or _at(_user_frame(sys._getframe(1), block.file))


def _after_fork_in_child():
    if _ACTIVE:  # a fork of the grading process made past the replaced os.fork: the child must not grade too
        REAL_EXIT(0)


@contextlib.contextmanager
def contained(file, doing: str):
    """``with contained(path, "while importing"):`` runs the block, the user's code in it, so that an exit, a fork,
    a thread left running, a KeyboardInterrupt of the code's own or a changed working directory raises
    :class:`UserCodeLeft` (one line: what the file did, where, ``doing``) instead of ending, doubling or hanging
    the process. Other exceptions pass through unchanged; a Ctrl-C pressed meanwhile is still a KeyboardInterrupt.
    Inside a block already running, it is that block."""
    if _ACTIVE:
        yield _ACTIVE[-1]
        return
    block = _Block(file, doing)
    block.__enter__()
    try:
        yield block
    except BaseException as exc:
        block.put_back()
        said = block.left(exc)
        if said is not None:
            raise said from None
        raise
    said = block.after(block.put_back())
    if said is not None:
        raise said
