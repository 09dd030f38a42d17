"""A run folder belongs to one process: an exclusive lock on ``RUN/run.lock``, held while it trains.

Two processes training into one folder would both write its checkpoints, ``run.json`` and
``metrics.jsonl`` (and a ``--resume`` started during a run would resume from its latest checkpoint
and train beside it). So the first thing ``train.py`` and ``python -m numformer.prepare`` do with a
run folder, before they read or write anything in it, is :func:`lock_run_folder`: an exclusive,
non-blocking ``fcntl.flock`` on ``RUN/run.lock``. A second process gets :class:`RunFolderInUse`, one
line naming the process that holds the folder and since when (exit status 2), and touches nothing.

The holder writes its identity into the lock file (process id, host, command, the time it took the
lock) right after taking it; the refused process reads it back. A lock file is never removed: the
kernel drops a flock when the last descriptor of its holder closes, and a process closes its
descriptors however it ends (SIGKILL included), so a file left behind by a killed run blocks
nobody, and the next run simply takes the lock. The identity left in it is then stale: a reader
that finds a dead process there waits a moment for the new holder to write its own.

Within one process the lock is taken once per folder (:func:`lock_run_folder` hands back the
lock already held), and released by :meth:`RunLock.release` or when the last reference to it goes.
Under ``mpirun`` only rank 0 touches the run folder, so only rank 0 takes the lock, and holds it for
every rank of the run.

A lock over NFS is only as good as the server's: keep run folders on a local disk, or make sure
two runs never share one.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
import weakref
from pathlib import Path

from .. import run_file_names
from ..errors import NumformerError, UsageError

_HELD: "weakref.WeakValueDictionary[str, RunLock]" = weakref.WeakValueDictionary()  # folder -> this process's lock


class RunFolderInUse(UsageError):
    """Another process holds the run folder; the message is one line naming it (exit status 2)."""


class RunLock:
    """This process's exclusive lock on a run folder (an open descriptor of ``RUN/run.lock``)."""

    def __init__(self, folder: Path, fd: int, holder: dict):
        self.folder, self.holder = folder, holder
        self._fd = fd
        self._close = weakref.finalize(self, os.close, fd)  # the kernel drops the flock with the descriptor

    @property
    def held(self) -> bool:
        return self._close.alive

    def release(self) -> None:
        """Give the folder up (another process may then take it)."""
        self._close()


def lock_run_folder(folder) -> RunLock:
    """Take ``folder`` for this process: create it if needed and lock ``folder/run.lock``.

    Returns the lock (the one this process already holds, if it does). Raises
    :class:`RunFolderInUse` when another process holds it, a UsageError when the folder cannot be
    created or written (the lock file is the first file written there).
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        key = str(folder.resolve())
        held = _HELD.get(key)
        if held is not None and held.held:
            return held
        fd = os.open(folder / run_file_names.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write to the run folder {folder}: {exc.strerror or exc}: choose another --out "
                         "or fix its permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunFolderInUse(in_use_message(folder, read_holder(folder))) from None
        raise UsageError(f"cannot lock the run folder {folder} ({exc.strerror or exc}): its file system does "
                         "not support locks: choose an --out on a local disk") from None
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}
    data = (json.dumps(holder) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)  # a refused process reads this; no fsync: it is read, if at all, while we live
    lock = RunLock(folder, fd, holder)
    _HELD[key] = lock
    return lock


def read_holder(folder, wait_s: float = 2.0) -> dict | None:
    """The identity the holder of ``folder``'s lock wrote, or None.

    The holder writes it just after taking the lock: a process refused in between reads nothing, or
    the identity a killed holder left, and waits (up to ``wait_s``) for the live one's.
    """
    path = Path(folder) / run_file_names.LOCK
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = None
        if not isinstance(info, dict):
            info = None
        if (info is not None and _alive(info)) or time.monotonic() >= deadline:
            return info
        time.sleep(0.02)


def _alive(holder: dict) -> bool:
    """Whether the process a lock file names still runs (taken as yes when it ran on another host)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def in_use_message(folder, holder: dict | None) -> str:
    """The one line a refused process prints."""
    if holder is None or not _alive(holder):
        who = "another process (it has not said which)"
    else:
        where = "" if holder.get("host") == socket.gethostname() else f" on {holder.get('host')}"
        who = f"process {holder.get('pid')}{where} ({holder.get('command', '?')}) since {holder.get('since', '?')}"
    return (f"{folder} is in use by {who}: wait for it to finish (or stop it), or choose another --out; "
            "nothing in the folder was touched")


@contextlib.contextmanager
def refusal_leaves_folder_as_found(folder):
    """``with refusal_leaves_folder_as_found(out):`` around what a run does before its first step (take the
    lock, check the settings, prepare the corpus): when that is refused (a :class:`NumformerError`: a bad
    flag value, a missing data file, a model file that is not one) or stopped (Ctrl-C, SIGTERM, SIGHUP:
    a KeyboardInterrupt, numformer/stop_signals.py), the folder is put back as it was found.

    What this run created there goes (``run.lock``, a half-prepared corpus, the folder itself if it was
    new); what was there before is never touched. Only a process that holds the folder's lock undoes
    anything: one refused because another process holds it (:class:`RunFolderInUse`) leaves it alone.
    A bug (not a NumformerError) leaves everything for its crash report.
    """
    folder = Path(folder)
    existed = folder.is_dir()
    before = set(os.listdir(folder)) if existed else set()
    try:
        yield
    except (NumformerError, KeyboardInterrupt):  # a refusal, or Ctrl-C, SIGTERM, SIGHUP while preparing
        held = _HELD.get(str(folder.resolve())) if folder.exists() else None
        if held is not None and held.held:
            _put_back(folder, existed, before, held)
        raise


def _put_back(folder: Path, existed: bool, before: set, lock: RunLock) -> None:
    """Remove what was created in ``folder`` since ``before`` (the whole folder if it is new), then let go."""
    new = [folder] if not existed else [folder / name for name in sorted(set(os.listdir(folder)) - before)]
    left = []
    for path in new:
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError:
            left.append(str(path))
    if left:  # the refusal's own line follows: this one says what could not be put back
        print(f"numformer: could not remove {', '.join(left)}, which this refused run created: delete it by hand",
              file=sys.stderr)
    lock.release()
