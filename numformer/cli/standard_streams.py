"""The standard streams as a command finds them: closed, unable to encode a character, or read by a
process that has gone. Each is answered in one line or by a quiet exit, never as a bug of numformer's.

* **Closed** (``<&-``, ``>&-``, ``2>&-``): Python then sets the stream to None, and the first
  ``sys.stdout.write`` would be an AttributeError (a bug report) while ``print`` drops the line silently,
  a translation among them. A closed standard output is refused when the command starts, before any work;
  a closed standard input is refused when it is first read (only commands that read it care); a closed
  standard error writes nowhere (there is nowhere to say anything: the exit status speaks).
* **An encoding that cannot hold a character** (``PYTHONIOENCODING=ascii``, a terminal in another code
  page): the character is printed as an escape (``\\xe9``) rather than failing the line.
* **A reader that has gone** (``... | head -1``): see
  :func:`numformer.cli.one_line_errors.one_line_errors`, which exits quietly with 141 as a tool killed by
  SIGPIPE does: nothing is lost by stopping a translation whose reader left. A training run is another matter:
  a day's work must not end at ``train.py ... | head -5`` (with ``PYTHONUNBUFFERED=1`` that was step 5, with no
  checkpoint and no word) or at a standard output that is full (``> /dev/full``): inside
  :func:`output_that_may_go`, standard output failing is said once on standard error and what would have been
  printed is dropped, while the command goes on.
"""
from __future__ import annotations

import contextlib
import errno
import os
import sys

from ..errors import UsageError


class ClosedInput:
    """Stands for a closed standard input: the first use of it is one line (UsageError, exit 2)."""

    def __init__(self, prog: str):
        self._prog = prog

    def __getattr__(self, name):
        raise UsageError(f"standard input is closed (<&-) but {self._prog} reads it: pipe the text in "
                         "(< FILE or ... |) or give the input as a file")

    def __iter__(self):
        return self.__getattr__("__iter__")


def _escaping(stream) -> tuple | None:
    """Make ``stream`` print what its encoding cannot hold as escapes; returns how to undo it (None: as it was)."""
    errors = getattr(stream, "errors", None)
    if errors in (None, "backslashreplace", "surrogateescape") or not hasattr(stream, "reconfigure"):
        return None
    try:
        stream.reconfigure(errors="backslashreplace")
    except (ValueError, OSError):  # a stream that cannot change now (already written in another mode)
        return None
    return stream, errors


def check_standard_streams(prog: str) -> None:
    """Inside the one-line errors, when the command starts: a closed standard output refused (UsageError),
    a closed standard input replaced by :class:`ClosedInput` (refused at first use)."""
    if sys.stdout is None:
        raise UsageError(f"standard output is closed (>&-): {prog} writes to it; send it to a file "
                         "(> FILE, or > /dev/null to drop it)")
    if sys.stdin is None:
        sys.stdin = ClosedInput(prog)


@contextlib.contextmanager
def streams_that_print_anything():
    """``with streams_that_print_anything():`` around the one-line errors, so that their line too is printed:
    characters the encoding cannot hold come out as escapes (put back after), and a closed standard error
    becomes os.devnull for the rest of the process (print would otherwise send the line to standard output)."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  (the process's, as stderr was)
    undo = [u for u in (_escaping(sys.stdout), _escaping(sys.stderr)) if u is not None]
    try:
        yield
    finally:
        for stream, errors in undo:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors=errors)


class _OutputThatMayGo:
    """Standard output for a command that must outlive it: a write or flush that fails (its reader gone, a full
    device, an I/O error) is said once on standard error and the stream becomes os.devnull; everything else is the
    stream's own."""

    def __init__(self, stream, prog: str, goes_on: str):
        self._stream, self._prog, self._goes_on, self.gone = stream, prog, goes_on, False

    def write(self, text):
        if not self.gone:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._went(exc)
        return len(text)

    def flush(self):
        if not self.gone:
            try:
                self._stream.flush()
            except OSError as exc:
                self._went(exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _went(self, exc: OSError) -> None:
        self.gone = True
        why = "its reader has gone" if exc.errno == errno.EPIPE else (exc.strerror or str(exc))
        _point_at_devnull(self._stream)
        try:
            print(f"{self._prog}: standard output cannot be written any more ({why}): {self._goes_on}",
                  file=sys.stderr, flush=True)
        except (OSError, ValueError):  # standard error gone too: the exit status will speak
            pass


def _point_at_devnull(stream) -> None:
    """Descriptor ``stream`` writes to, pointed at os.devnull: what is still buffered for it is dropped there, so
    that no later flush (the interpreter's last one among them: exit status 120) fails again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test's captured stream)
        pass


@contextlib.contextmanager
def output_that_may_go(prog: str, goes_on: str):
    """``with output_that_may_go("train.py", "training goes on; ..."):`` standard output failing inside the block
    (``| head -5``'s reader gone, ``> /dev/full``) is one line on standard error, ``prog: standard output cannot be
    written any more (WHY): GOES_ON``, and no longer stops the command; its lines are dropped from then on."""
    real = sys.stdout
    if real is None or isinstance(real, _OutputThatMayGo):
        yield
        return
    sys.stdout = _OutputThatMayGo(real, prog, goes_on)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = real
