"""Writing a file so that a crash never leaves half of it: write a temporary file beside the target,
flush and fsync it, then rename it over the target (``os.replace`` is atomic on POSIX).

Every file numformer writes for keeps (checkpoints, the vocabulary, the prepared corpus, run.json, the
translations, exported and imported models) goes through :func:`atomic_write`, :func:`atomic_write_bytes`
or :func:`atomic_write_text`; a file too large to hold in memory is streamed with :func:`atomic_file`; a
folder (a Hugging Face or CTranslate2 model) is staged whole by :func:`atomic_folder`.

The temporaries carry a recognisable name, ``.TARGET.numformer-partial-PID-XXXX``: the target they were
for and the process writing them (a target whose name leaves no room for that tail within the file system's
limit is named by its start and a hash of the whole, :func:`beside_name`). A write killed outright (SIGKILL, a power cut) cannot remove its own,
so every later write beside the same target first removes those whose process is gone, in one line on
standard error (:func:`sweep_stale_partials`); one whose writer still runs is left alone.

A full disk while writing is a one-line :class:`OutOfSpace` naming the file and how much it needed, and
the target is left as it was.

Outputs by what they are (:func:`output_kind`): a symbolic link is written through, its target replaced
atomically and the link kept (a ``latest.txt`` pointing at today's file stays a link); a character or block
device, a named pipe (FIFO) or a Unix socket is written into directly and never replaced (``--out
/dev/stdout`` must not become a regular file under /dev, a FIFO's reader must get the bytes): there is no
temporary beside such a target, so what its reader gets is not atomic.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path

from .errors import NumformerError, UsageError

#: What a temporary's name holds between its target's name and its writer's process id.
PARTIAL_MARK = ".numformer-partial-"
# The errors of a full disk or quota: the machine's, not numformer's (one line, exit 2).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class OutOfSpace(NumformerError, OSError):
    """The disk (or the quota) filled while writing a file: its message names the file and the space it
    needed; the file it was to replace is untouched."""

_UMASK = os.umask(0)  # read once: mkstemp creates 0600 files, ours get the usual 0666 & ~umask
os.umask(_UMASK)

# -- outputs by what they are ----------------------------------------------------------------------------

NEW = "new"              # nothing there yet: created
FILE = "file"            # a regular file: replaced atomically
FOLDER = "folder"
DEVICE = "device"        # a character or block device (/dev/null, /dev/stdout's terminal): written into
FIFO = "named pipe"      # a FIFO: written into, its reader gets the bytes
SOCKET = "socket"        # a Unix socket: connected to and written into
LOOP = "link loop"       # a symbolic link that never reaches a target
#: The kinds written into as they are, never replaced (no temporary beside them).
WRITTEN_INTO = (DEVICE, FIFO, SOCKET)


def written_path(path) -> Path:
    """The path a write of ``path`` lands on: ``path`` itself, or, when it is a symbolic link (a chain of
    them), the file it points to, so that the target is replaced and the link kept. A dangling link's target is
    created. Links in the folders above are followed too (the temporary is made beside the real target)."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def output_kind(path) -> str:
    """What writing ``path`` meets, after any symbolic link: :data:`NEW`, :data:`FILE`, :data:`FOLDER`,
    :data:`DEVICE`, :data:`FIFO`, :data:`SOCKET`, or :data:`LOOP` (a link that leads back to itself)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return NEW
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return LOOP
        if exc.errno == errno.ENOTDIR:
            return NEW  # a file above it: the preflight names that
        raise
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return FOLDER
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return DEVICE
    if stat.S_ISFIFO(mode):
        return FIFO
    if stat.S_ISSOCK(mode):
        return SOCKET
    return DEVICE  # another special file (a door, a whiteout): written into, never replaced


@contextlib.contextmanager
def _written_into(path: Path, kind: str):
    """A binary file object writing straight into the device, FIFO or socket ``path``; a full device
    (/dev/full) is :class:`OutOfSpace` naming it."""
    written = 0
    try:
        if kind == SOCKET:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
                with sock.makefile("wb") as f:
                    yield f
                    f.flush()
        else:
            with open(path, "wb") as f:
                yield f
                written = f.tell() if f.seekable() else 0
                f.flush()
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise out_of_space(path, written) from None
        raise


@contextlib.contextmanager
def atomic_file(path, durable: bool = True, needed: int | None = None):
    """``with atomic_file(path) as f:`` a binary file object whose contents become ``path`` when the block
    ends without an exception (else the temporary is removed and ``path`` is untouched).

    ``durable``: fsync the file and its folder (what a crash must not undo); False for files that
    are cheap to rebuild. ``needed``: the file's size where known beforehand (a full disk names it).
    """
    path = written_path(path)  # a symbolic link: its target is replaced, the link kept
    kind = output_kind(path)
    if kind in WRITTEN_INTO:  # a device, FIFO or socket: written into, never replaced by a regular file
        with _written_into(path, kind) as f:
            yield f
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with claim_output(path):  # a second process writing the same file is refused, not interleaved
        sweep_stale_partials(path.parent, path.name)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=partial_prefix(path))
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o666 & ~_UMASK)
                yield f
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
                raise out_of_space(path, written, needed) from None
            raise
    if durable:
        _fsync_folder(path.parent)


def atomic_write(path, write, durable: bool = True, needed: int | None = None) -> None:
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it to ``path``."""
    with atomic_file(path, durable, needed) as f:
        write(f)


def atomic_write_bytes(path, data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path. A full disk names the size it needed."""
    atomic_write(path, lambda f: f.write(data), durable, needed=len(data))
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
    out = written_path(out)  # a link to a (new or empty) folder: that folder is replaced, the link kept
    if output_kind(out) in WRITTEN_INTO:
        raise UsageError(f"{out} is a {output_kind(out)}: a folder cannot be written there: give a new or empty "
                         "folder (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with claim_output(out):  # a second export into the same folder is refused, not mixed into it
        sweep_stale_partials(out.parent, out.name)
        stage = Path(tempfile.mkdtemp(prefix=partial_prefix(out), dir=out.parent))
        with _removed_on_failure(stage, out):
            fill(stage)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(stage, 0o777 & ~mask)
            if out.exists():
                refuse_filled_meanwhile(out)
                out.rmdir()
            os.replace(stage, out)
    return out


@contextlib.contextmanager
def _removed_on_failure(stage: Path, target: Path):
    """A staging folder for ``target``, removed when the block fails; a full disk meanwhile is
    :class:`OutOfSpace` naming ``target`` and how far the stage got."""
    try:
        yield stage
    except BaseException as exc:
        written = _size(stage)
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            raise out_of_space(target, written) from None
        raise


#: The longest file name most file systems take (ext4, XFS, btrfs, tmpfs: 255 bytes); the folder's own limit is
#: asked where it can be (:func:`name_limit`).
NAME_MAX = 255
# What a temporary's name holds after its mark: the PID (up to 7 digits), a dash, mkstemp's 8 random characters.
_TAIL = 16


def name_limit(folder) -> int:
    """The longest file name, in bytes, the file system of ``folder`` (or the nearest folder above that exists)
    takes."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def beside_name(name: str, mark: str, limit: int = NAME_MAX) -> str:
    """The hidden name of something numformer keeps beside the target ``name`` (``.NAME`` + ``mark``: a
    temporary, a claim), short enough that, with a temporary's tail, it fits in ``limit`` bytes: a name too
    long for that (one the file system takes, but not with the tail) keeps its start and gets the first 12 hex
    digits of its SHA-256, so that every writer of the same target still meets on the same name."""
    whole = f".{name}{mark}"
    if len(os.fsencode(whole)) + _TAIL <= limit:
        return whole
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:12]
    room = limit - _TAIL - len(os.fsencode(f".~{digest}{mark}"))
    start = os.fsencode(name)[:max(room, 0)].decode("utf-8", "ignore")
    return f".{start}~{digest}{mark}"


def partial_prefix(target) -> str:
    """The name a temporary for ``target`` starts with (mkstemp adds a random tail): hidden, naming its
    target and this process (:func:`beside_name`: a long target name is shortened to fit)."""
    target = Path(target)
    return f"{beside_name(target.name, PARTIAL_MARK, name_limit(target.parent))}{os.getpid()}-"


def stale_partials(folder, name: str | None = None) -> list:
    """The temporaries in ``folder`` (for the target ``name``, or any) whose writing process is gone."""
    found = []
    start = (glob.escape(beside_name(name, PARTIAL_MARK, name_limit(folder))) if name is not None
             else f".*{PARTIAL_MARK}")
    for path in Path(folder).glob(f"{start}*"):
        pid = path.name.rsplit(PARTIAL_MARK, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            found.append(path)
    return sorted(found)


def sweep_stale_partials(folder, name: str | None = None) -> list:
    """Remove what killed writes left in ``folder`` (for ``name``, or any target), saying so in one line on
    standard error; returns the removed paths. A temporary that cannot be removed is named instead."""
    gone, kept = [], []
    for path in stale_partials(folder, name):
        size = _size(path)
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            gone.append((path, size))
        except OSError:
            kept.append(path)
    if gone:
        print(f"numformer: removed what a killed write left in {folder} ({_mb(sum(n for _, n in gone))} freed): "
              f"{', '.join(p.name for p, _ in gone)}", file=sys.stderr)
    if kept:
        print(f"numformer: cannot remove what a killed write left: {', '.join(map(str, kept))}: delete it by hand",
              file=sys.stderr)
    return [p for p, _ in gone]


def out_of_space(path, written: int, needed: int | None = None) -> OutOfSpace:
    """The one-line error of a full disk while writing ``path``, ``written`` bytes in (``needed``: the
    file's whole size, where known)."""
    folder = Path(path).parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = 0
    need = f"it needs {_mb(needed)}" if needed is not None else f"it filled after {_mb(written)}, more needed"
    exc = OutOfSpace(f"no space left on the disk of {folder} while writing {path}: {need}, {_mb(free)} free "
                     "now: free space or write elsewhere (nothing was replaced)")
    exc.errno = errno.ENOSPC  # still an OSError of a full disk to code that asks (str() stays the message)
    return exc


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _size(path) -> int:
    path = Path(path)
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"


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
    (an optional flag not given) or do not exist are skipped. Every command calls it through
    :func:`numformer.cli.preflight.check_output`, which adds the checks of the output's own place."""
    from .file_kinds import shown  # noqa: PLC0415  (paths are printed on one line, whatever they hold)

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
            raise UsageError(f"{flag} {shown(out)} would overwrite the input {shown(source)}: write to another path "
                             "(nothing was written)")


# -- one writer per output, and files a third-party library writes by name ----------------------------------

#: What the claim of a target is called beside it: ``.TARGET.numformer-writing``, holding the writer's PID.
CLAIM_MARK = ".numformer-writing"
_held_claims: dict = {}  # the targets this process claims -> how many of its writes hold the claim


class OutputInUse(NumformerError):
    """Another live process is writing the same output (issue 59: two exports into one folder, two commands
    writing one file): the second writer is refused in one line, never mixed into the first's result."""


def claim_path(target) -> Path:
    """The claim file of ``target``: hidden, beside it, one name per target (so two writers meet on it)."""
    target = Path(target)
    return target.with_name(beside_name(target.name, CLAIM_MARK, name_limit(target.parent)))


@contextlib.contextmanager
def claim_output(target):
    """Hold ``target`` for this process while writing it: a second live process asking for the same target
    gets :class:`OutputInUse` naming the holder's PID (exit 2). The claim is a file beside the target made
    whole and then linked to its one name (``os.link`` fails when the name exists, so exactly one writer wins
    and nobody reads a half-written PID); a claim whose process is gone (SIGKILL, a power cut) is taken over.
    Re-entrant within a process (a write nested in a write of the same target, threads of one process)."""
    target = Path(target)
    key = str(target.resolve())
    if _held_claims.get(key):
        _held_claims[key] += 1
        try:
            yield
        finally:
            _held_claims[key] -= 1
        return
    claim = claim_path(target)
    _take_claim(target, claim)
    _held_claims[key] = 1
    try:
        yield
    finally:
        del _held_claims[key]
        with contextlib.suppress(OSError):
            claim.unlink()


def _take_claim(target: Path, claim: Path) -> None:
    """Link a finished file holding this PID to ``claim``; refuse while a live process holds it."""
    fd, tmp = tempfile.mkstemp(dir=claim.parent, prefix=partial_prefix(claim))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        for _ in range(3):  # a stale claim is removed and the link tried again
            try:
                os.link(tmp, claim)
                return
            except FileExistsError:
                holder = _claim_holder(claim)
                if holder is not None and holder != os.getpid() and _alive(holder):
                    raise OutputInUse(f"{target} is being written by another process (PID {holder}): wait for it "
                                      "or choose another --out (nothing was written)") from None
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()  # its writer is gone: what it claimed is free
            except OSError:  # a file system without hard links: no claim, as before (the rename stays atomic)
                return
        raise OutputInUse(f"{target} is being claimed by other processes over and over: wait for them or "
                          "choose another --out (nothing was written)")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _claim_holder(claim: Path) -> int | None:
    """The PID a claim file names, None when it is gone or unreadable."""
    try:
        text = claim.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def refuse_filled_meanwhile(out: Path) -> None:
    """Before a staged folder replaces ``out``: an ``out`` that is now a file or a folder with contents was
    written by someone else since the command checked it (another export that finished first); it is kept,
    and this write refused in one line."""
    if not out.is_dir() or any(out.iterdir()):
        raise OutputInUse(f"{out} was written by another process while this one worked: it is kept; choose "
                          "another --out (nothing was written)")


def atomic_files(targets, write) -> list:
    """Files a third-party library writes by name (sentencepiece's trainer writes ``PREFIX.model`` and
    ``PREFIX.vocab`` in place, so a kill left a cut model under its real name, issue 59), made atomic:
    ``write(stage)`` writes each target's name inside a staging folder beside the first target (the partial
    name, so a killed writer's stage is swept like any temporary); each file is then fsynced and renamed onto
    its target, in the order given (the file that matters first), and the stage removed. On any failure the
    stage is removed and the targets keep their old bytes. Returns the targets."""
    targets = [written_path(t) for t in targets]  # a link: its target replaced, the link kept
    first = targets[0]
    first.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as claims:
        for target in targets:
            if output_kind(target) not in WRITTEN_INTO:  # no claim file beside a device (in /dev)
                claims.enter_context(claim_output(target))
        for target in targets:
            sweep_stale_partials(target.parent, target.name)
        stage = Path(tempfile.mkdtemp(prefix=partial_prefix(first), dir=first.parent))
        with _removed_on_failure(stage, first):
            write(stage)
            missing = [t.name for t in targets if not (stage / t.name).is_file()]
            if missing:
                raise RuntimeError(f"the writer did not write {', '.join(missing)}")  # a bug: ours to report
            for target in targets:
                staged = stage / target.name
                kind = output_kind(target)
                if kind in WRITTEN_INTO:  # a device or a pipe given as the file: its bytes written into it
                    with open(staged, "rb") as f, _written_into(target, kind) as out:
                        shutil.copyfileobj(f, out)
                    continue
                with open(staged, "rb") as f:
                    os.fsync(f.fileno())
                os.chmod(staged, 0o666 & ~_UMASK)
                os.replace(staged, target)
        shutil.rmtree(stage, ignore_errors=True)
    _fsync_folder(first.parent)
    return targets
