"""The signals that ask a command to stop, handled as Ctrl-C is: SIGTERM and SIGHUP.

Python turns Ctrl-C (SIGINT) into a KeyboardInterrupt, and every place numformer cleans up after one (the
atomic writer removes its temporary, a run refused before its first step puts its folder back as found)
does so. SIGTERM (what a cluster scheduler or ``kill`` sends) and SIGHUP (the terminal closed) would
otherwise end the process where it stands, leaving half-written temporaries and, in a prepared run folder,
half a corpus. :func:`stop_signals_as_interrupts` (worn by every command through the front,
numformer/cli/front.py) raises :class:`numformer.errors.Stopped`, a KeyboardInterrupt, for them instead, so
they take the same clean-up path; the command then exits with the shell's status for the signal
(128 + its number: 143, 129) after one line. Training asks for more (a checkpoint of the current step):
:class:`numformer.training.replicas.StopRequests` takes the same signals over while the loop runs.

A signal the process was started ignoring stays ignored: ``nohup`` ignores SIGHUP so that the command
outlives its terminal.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from .errors import HUNG_UP_EXIT, INTERRUPTED_EXIT, TERMINATED_EXIT, Stopped

# signal -> (what the command's one line says, its exit status). SIGHUP does not exist on Windows.
STOP_SIGNALS = {signal.SIGTERM: ("terminated", TERMINATED_EXIT)}
if hasattr(signal, "SIGHUP"):
    STOP_SIGNALS[signal.SIGHUP] = ("hung up", HUNG_UP_EXIT)


def stopped(signum: int) -> KeyboardInterrupt:
    """The exception that stands for ``signum``: KeyboardInterrupt for SIGINT, :class:`Stopped` for the others."""
    if signum in STOP_SIGNALS:
        what, code = STOP_SIGNALS[signum]
        return Stopped(signum, what, code)
    return KeyboardInterrupt()


def what_stopped(signum: int | None) -> str:
    """What a stop asked by ``signum`` is called in the line that reports it: ``terminated (SIGTERM)``, ``hung up
    (SIGHUP)``, ``interrupted (Ctrl-C)``; another signal (mpirun's forwarded SIGUSR1) by its name."""
    if signum in STOP_SIGNALS:
        return f"{STOP_SIGNALS[signum][0]} ({signal.Signals(signum).name})"
    if signum is None or signum == signal.SIGINT:
        return "interrupted (Ctrl-C)"
    return f"stopped ({signal.Signals(signum).name})"


def exit_status(signum: int | None) -> int:
    """The exit status after a stop asked by ``signum`` (130 for Ctrl-C or an unknown signal)."""
    return STOP_SIGNALS[signum][1] if signum in STOP_SIGNALS else INTERRUPTED_EXIT


@contextlib.contextmanager
def stops_say(said):
    """``with stops_say(lambda what: f"{what} during X: ... saved; continue with ..."):`` a stop inside the block
    (Ctrl-C, SIGTERM, SIGHUP: a KeyboardInterrupt) ends the command with the line ``said(what)`` returns (``what``:
    :func:`what_stopped`'s ``terminated (SIGTERM)``...), which says what is saved and what finishes the job, instead
    of a bare ``terminated``; the exit status stays the signal's. ``said`` returning None leaves the line as it was."""
    try:
        yield
    except KeyboardInterrupt as exc:
        line = said(what_stopped(getattr(exc, "signum", None)))
        if line:
            exc.what = line
        raise


def ignored_from_start(signum: int) -> bool:
    """Whether the process runs with ``signum`` ignored (``nohup`` for SIGHUP): such a signal stays ignored."""
    return signal.getsignal(signum) is signal.SIG_IGN


def _raise_stopped(signum, frame):
    raise stopped(signum)


@contextlib.contextmanager
def stop_signals_as_interrupts():
    """``with stop_signals_as_interrupts():`` SIGTERM and SIGHUP raise :class:`Stopped` in the main thread
    (elsewhere Python delivers no signal: nothing is installed); the previous handlers come back after."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if not ignored_from_start(signum):
                previous[signum] = signal.signal(signum, _raise_stopped)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
