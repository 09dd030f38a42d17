"""The one base class of every error a user can cause, and its exit code.

The command-line tools (``train.py``, ``translate.py``, ``python -m numformer.checkpoint`` ...) print
an error raised on purpose for bad input as one line, ``prog: error: what is wrong: what to do``, and
exit with the error's :attr:`NumformerError.exit_code` (2 unless the class says otherwise). Every such
error is a :class:`NumformerError`: :class:`UsageError` and :class:`StopTraining` here, and beside the
code that raises them ``DataError``, ``CheckpointError``, ``BackendError``, ``PrecisionError``,
``DistributedError``, ``RunFolderInUse``, ``SwapError``, ``UserCodeError``, ``KernelModeError``.
Anything else that escapes, a plain ``ValueError`` from NumPy included, is a bug in numformer: the
tools say so and write its traceback to a file (:mod:`numformer.cli.one_line_errors`), exit status
:data:`BUG_EXIT`.
"""
from __future__ import annotations

BUG_EXIT = 1          # a bug in numformer
INTERRUPTED_EXIT = 130  # Ctrl-C (the shell's 128 + SIGINT)
TERMINATED_EXIT = 143   # SIGTERM, what a cluster scheduler sends before it kills a job (128 + 15)
HUNG_UP_EXIT = 129      # SIGHUP, the terminal closed (128 + 1)
READER_GONE_EXIT = 141  # the reader of standard output went away (128 + SIGPIPE, as the shell reports)


class NumformerError(Exception):
    """A mistake of the user's or of the machine's (not of numformer's); the message is one line
    saying what is wrong and what to do. ``exit_code``: the status the command lines exit with."""

    exit_code = 2


class UsageError(NumformerError, ValueError):
    """Flags or settings that cannot work together.

    Also a ValueError, so code that called these checks expecting ValueError keeps working.
    """


class StopTraining(NumformerError, RuntimeError):
    """Training cannot go on (a run of non-finite steps, :mod:`numformer.training.trainer`); the last
    good checkpoint is untouched. Exit status 3."""

    exit_code = 3


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread by the front's handlers (numformer/cli/stop_signals.py).

    A KeyboardInterrupt, so that every place that cleans up after Ctrl-C (the atomic writer's temporaries, a
    run folder put back as found, a checkpoint of the current step) cleans up after these the same way; only
    the line (``what``) and the exit status (``exit_code``, 128 + the signal's number) differ."""

    def __init__(self, signum: int, what: str, exit_code: int):
        super().__init__(what)
        self.signum, self.what, self.exit_code = signum, what, exit_code


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its class name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def exit_code_of(exc: BaseException) -> int:
    """The exit status a command line gives for ``exc``: a :class:`NumformerError`'s ``exit_code``,
    130 for Ctrl-C (143 for SIGTERM, 129 for SIGHUP: :class:`Stopped`), a ``SystemExit``'s own code, else
    :data:`BUG_EXIT`."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, KeyboardInterrupt):
        return getattr(exc, "exit_code", INTERRUPTED_EXIT)
    code = getattr(exc, "exit_code", None)  # NumformerError, and the relayed error of another rank
    return int(code) if isinstance(code, int) else BUG_EXIT


# -- errors every process meets together (several processes: numformer.training.distributed) --------

def mark_collective(exc: BaseException) -> BaseException:
    """Record that every rank raises this exception at the same point (no rank is left waiting)."""
    try:
        exc.collective = True
    except AttributeError:  # an exception type with __slots__: treated as rank-local
        pass
    return exc


def is_collective(exc: BaseException | None) -> bool:
    """True for an exception every rank raises together (see :func:`mark_collective`)."""
    return bool(getattr(exc, "collective", False))
