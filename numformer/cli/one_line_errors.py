"""One-line errors for the command lines: a user's mistake is one line and an exit code, a bug says so.

Every mistake a user can make on the command line ends the same way: one line
``prog: error: what is wrong: what to do`` on stderr, the error's exit status
(2 for bad input, 3 when training had to stop, 130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP) and no
traceback; a reader of standard output that has gone (``| head -1``) ends the command quietly, 141. Only errors raised on purpose for bad input are such one-liners
(:class:`numformer.errors.NumformerError` and its exit code); anything else is a bug in numformer:
one line says so and names the file its traceback was written to, exit status 1.
``NUMFORMER_DEBUG=1`` shows the traceback instead in both cases.
"""
from __future__ import annotations

import errno
import os
import re
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from .. import environment, run_file_names
from ..errors import BUG_EXIT, INTERRUPTED_EXIT, READER_GONE_EXIT, NumformerError, first_line

# An OSError that says the machine, not the program, is at fault (a full disk, a read-only file system):
# one line as well. Any other OSError that escapes was not expected where it happened: a bug.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
# An OSError on a path that says the path given is the wrong kind of place: a file where a folder must go
# (or the reverse), a folder the user may not write, a name too long. The paths numformer opens come from
# its flags, so such an error names the user's path: one line saying to check it, not a bug report.
PATH_ERRNOS = frozenset({errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG})


def error_line(exc: BaseException) -> str:
    """The first line of an exception's message (OSError: 'file: reason')."""
    if isinstance(exc, OSError) and not isinstance(exc, NumformerError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{where}: {exc.strerror}" if where else exc.strerror
    return first_line(exc)


def write_crash_log(prog: str, exc: BaseException, folder=None) -> Path | None:
    """Write ``exc``'s traceback to ``folder/crash.log`` (a run folder), else to a new temporary file;
    returns the path (None when nothing could be written). Never raises: a crash report must not hide
    the crash."""
    text = (f"{prog} crashed at {time.strftime('%Y-%m-%d %H:%M:%S')}\ncommand: {' '.join(sys.argv)}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    if folder is not None:
        try:
            path = Path(folder) / run_file_names.CRASH_LOG
            if path.parent.is_dir():
                path.write_text(text, encoding="utf-8")
                return path
        except OSError:
            pass
    try:
        stem = re.sub(r"[^A-Za-z0-9_.]+", "-", Path(prog).name.removesuffix(".py").removeprefix("python -m "))
        fd, name = tempfile.mkstemp(prefix=f"numformer-{stem}-crash-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return Path(name)


class ErrorReport:
    """What :func:`one_line_errors` yields: set ``crash_folder`` (a run folder, once it is known) and a
    bug's traceback goes to its ``crash.log`` instead of a temporary file."""

    def __init__(self):
        self.crash_folder = None


@contextmanager
def one_line_errors(prog: str):
    """Turn a user mistake into ``prog: error: message`` on stderr, no traceback.

    Exit status: a :class:`~numformer.errors.NumformerError`'s ``exit_code`` (2 for bad input, 3: training
    stopped), 2 for an OSError of a full disk or a read-only file system, 130 for Ctrl-C (SIGTERM and SIGHUP,
    :class:`~numformer.errors.Stopped`: their own line and status), 141 with nothing printed when the reader of
    standard output has gone. Anything else is a bug: one line says so and where its traceback was written
    (the yielded report's ``crash_folder``/crash.log when that folder exists, else a temporary file), exit
    status 1.
    """
    report = ErrorReport()
    try:
        debug, refused = environment.debug(), None
    except NumformerError as exc:  # NUMFORMER_DEBUG itself cannot be read: one line, as any other variable
        debug, refused = False, exc
    try:
        if refused is not None:
            raise refused
        yield report
    except KeyboardInterrupt as exc:
        if debug:
            raise
        if environment.launched_rank() in (None, 0):  # several processes: rank 0 speaks for all (mpirun ends a
            # job by sending SIGTERM to the ranks still running after one failed, which said why itself)
            print(f"{prog}: {getattr(exc, 'what', 'interrupted')}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", INTERRUPTED_EXIT))
    except BrokenPipeError:
        # The reader of standard output went away (``| head -1``): what a tool killed by SIGPIPE does, quietly.
        # Standard output now points at os.devnull, so that the interpreter's last flush has nowhere to fail.
        _drop_standard_output()
        sys.exit(READER_GONE_EXIT)
    except NumformerError as exc:
        if debug:
            raise
        print(f"{prog}: error: {error_line(exc)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if debug:
            raise
        if exc.errno in ENVIRONMENT_ERRNOS:
            print(f"{prog}: error: {error_line(exc)}: free space or choose another place, then run again",
                  file=sys.stderr)
            sys.exit(2)
        if exc.errno in PATH_ERRNOS and exc.filename is not None:
            print(f"{prog}: error: {error_line(exc)}: check the path given (a file where a folder goes, or the "
                  "reverse, or a place you may not write), then run again", file=sys.stderr)
            sys.exit(2)
        _bug(prog, exc, report.crash_folder)
    except Exception as exc:  # noqa: BLE001  (not a user error: a bug, reported as one)
        if debug:
            raise
        _bug(prog, exc, report.crash_folder)


def _drop_standard_output() -> None:
    """Point file descriptor 1 at os.devnull (what is still buffered for the gone reader is dropped with it)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test's captured stream): nothing to do
        pass


def _bug(prog: str, exc: BaseException, folder) -> None:
    path = write_crash_log(prog, exc, folder)
    if path is None:  # nowhere to write it: the traceback itself, here
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    print(f"{prog}: internal error (a bug in numformer, not in your input): {type(exc).__name__}: "
          f"{error_line(exc)}; " + (f"the traceback is in {path}: please report it with that file" if path else
                                    "please report it with the traceback above"), file=sys.stderr)
    sys.exit(BUG_EXIT)
