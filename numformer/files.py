"""Writing a file so that a crash never leaves half of it: write a temporary file beside the target,
flush and fsync it, then rename it over the target (``os.replace`` is atomic on POSIX).

Every file numformer writes for keeps (checkpoints, the vocabulary, the prepared corpus, run.json, the
translations) goes through :func:`atomic_write`, :func:`atomic_write_bytes` or
:func:`atomic_write_text`; a file too large to hold in memory is streamed with :func:`atomic_file`.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from .errors import UsageError

_UMASK = os.umask(0)  # read once: mkstemp creates 0600 files, ours get the usual 0666 & ~umask
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_file(path, durable: bool = True):
    """``with atomic_file(path) as f:`` a binary file object whose contents become ``path`` when the block
    ends without an exception (else the temporary is removed and ``path`` is untouched).

    ``durable``: fsync the file and its folder (what a crash must not undo); False for files that
    are cheap to rebuild.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_folder(path.parent)


def atomic_write(path, write, durable: bool = True) -> None:
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it to ``path``."""
    with atomic_file(path, durable) as f:
        write(f)


def atomic_write_bytes(path, data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    atomic_write(path, lambda f: f.write(data), durable)
    return Path(path)


def atomic_write_text(path, text: str, durable: bool = True) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"), durable)


def write_json(path, record) -> Path:
    """``record`` as indented JSON (UTF-8, a newline at the end), written atomically."""
    return atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def atomic_folder(out, fill) -> Path:
    """Write the folder ``out`` whole or not at all: ``fill(stage)`` fills a staging folder beside it, which is
    then renamed into place (an empty ``out`` is replaced); on any failure the stage is removed. The stage gets
    the permissions a new folder would (mkdtemp makes it 0700)."""
    import shutil  # noqa: PLC0415

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        fill(stage)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(stage, 0o777 & ~mask)
        if out.exists():
            out.rmdir()
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


def remove_stale_temporaries(folder) -> list:
    """Delete the temporary files a killed write left in ``folder``; returns their paths."""
    gone = []
    for tmp in Path(folder).glob(".*.tmp"):
        try:
            tmp.unlink()
            gone.append(tmp)
        except OSError:
            pass
    return gone


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (not every file system can: then nothing to do)."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def refuse_output_over_inputs(out, inputs, flag: str = "--out") -> None:
    """Raise :class:`UsageError` before anything is read when writing ``out`` could destroy an input: ``out`` is
    an input file or folder (by path, or the same file through a link), or an input lies inside ``out`` (a
    folder a command would replace). ``out`` inside an input folder is allowed (``average --last N RUN --out
    RUN/averaged.npz`` adds a file to the run; a checkpoint it reads is never that file). Inputs that are None
    (an optional flag not given) or do not exist are skipped."""
    target = Path(out)
    if not str(out).strip():
        raise UsageError(f"{flag} is empty: name the file or folder to write")
    resolved = target.resolve()
    for source in inputs:
        if source is None or not Path(source).exists():
            continue
        source = Path(source)
        src = source.resolve()
        same = src == resolved or (target.exists() and os.path.samefile(src, target))
        if same or resolved in src.parents:
            raise UsageError(f"{flag} {out} would overwrite the input {source}: write to another path "
                             "(nothing was written)")
