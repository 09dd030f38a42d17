"""The one check every command makes on what it will write, before its first long step.

A translation, an export, a study or a plot that runs for minutes and then cannot write its result has thrown
that time away; one that writes over a file its run folder needs has lost more. So every command that writes
calls :func:`check_output` on each output as soon as its flags are parsed, and refuses in one line, exit 2,
with nothing computed and nothing written (docs/guarantees.md, "Outputs checked before any work"):

* an existing folder where a file goes, a file where a folder goes (the output itself or a folder above it);
* a folder that would be replaced whole (an exported Hugging Face or CTranslate2 model) that already holds files;
* a place that cannot be written (a read-only or forbidden folder): a temporary is created beside the target
  and removed at once, which is what the atomic writer will do, so the answer is the file system's own;
* a file a run folder needs (its vocabulary, ``run.json``, its lock, metrics logs, checkpoints, prepared data),
  whichever command writes it: ``translate.py --output RUN/spm.model`` would leave a run that cannot resume;
* an input of the same command (:func:`numformer.files.refuse_output_over_inputs`, which this extends);
* a name longer than the file system takes (said as such, not as a place that cannot be written).

What the output is decides how it is written (:func:`numformer.files.output_kind`), and the refusals name it: a
regular file or a new one is replaced atomically; a symbolic link is written through (its target checked as the
output and replaced, the link kept); a device, a named pipe or a socket is written into as it is, never
replaced, and refused where a folder goes; a link that loops is refused.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .. import run_file_names
from ..errors import UsageError
from ..file_kinds import RUN_FOLDER, kind_of, shown
from ..files import (LOOP, WRITTEN_INTO, name_limit, output_kind, partial_prefix, refuse_output_over_inputs,
                     written_path)

FILE = "file"              # one file, written whole (a model file, a translation, a picture)
FOLDER = "folder"          # a folder that files are written into (plots, a study's outputs, an exercise)
NEW_FOLDER = "new folder"  # a folder written whole and renamed into place (an exported model): new or empty

#: The files of a run folder without which it cannot resume or be read: never an output of another command.
RUN_FILES = {run_file_names.SETTINGS: "settings", run_file_names.LOCK: "lock", run_file_names.VOCAB: "vocabulary",
             "spm.vocab": "vocabulary's piece list", run_file_names.MARIAN_VOCAB: "vocabulary",
             run_file_names.METRICS: "metrics log", run_file_names.GRAD_STATS: "gradient statistics log"}
#: The folders of a run folder whose contents are the run's (its checkpoints, its prepared corpus).
RUN_SUBFOLDERS = {run_file_names.CHECKPOINTS: "checkpoints", run_file_names.PREPARED: "prepared data"}


def check_output(out, flag: str = "--out", inputs=(), kind: str = FILE, new_folders: bool = True) -> Path:
    """Refuse ``out`` (given with ``flag``) in one :class:`UsageError` when writing it, as ``kind`` (:data:`FILE`,
    :data:`FOLDER` or :data:`NEW_FOLDER`), cannot work or would destroy something; returns it as a Path.
    ``inputs``: the command's input paths (None for an optional flag not given). ``new_folders``: whether the
    folders above ``out`` may be created (False: they must exist, as for a file a Unix tool writes). Nothing is
    created."""
    shown_out = f"{flag} {shown(out)}"
    _refuse_too_long(Path(out), shown_out)  # first: a name too long fails every look at the path
    what = output_kind(out)
    if what == LOOP:  # before anything resolves the path (pathlib calls a loop a RuntimeError)
        raise UsageError(f"{shown_out} is a symbolic link that loops (it never reaches a file): remove it or give "
                         "another path (nothing was written)")
    refuse_output_over_inputs(out, inputs, flag)
    out = Path(out)
    target = written_path(out)  # a symbolic link is written through: its target is the output
    for path in dict.fromkeys((out, target)):
        needed = _run_file(path)
        if needed is not None:
            raise UsageError(f"{shown_out} is the {needed} of the run folder {shown(_run_of(path))}, which the run "
                             "needs: write to another path (nothing was written)")
    if what in WRITTEN_INTO:
        if kind == FILE:
            return out  # a device, a named pipe, a socket (/dev/null): written into as it is, never replaced
        raise UsageError(f"{shown_out} is a {what}: give a folder (nothing was written)")
    if kind == FILE and target.is_dir():
        raise UsageError(f"{shown_out} is a folder: give a file path (nothing was written)")
    if kind in (FOLDER, NEW_FOLDER) and target.exists() and not target.is_dir():
        raise UsageError(f"{shown_out} is a file: give a folder (nothing was written)")
    if kind == NEW_FOLDER and out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{shown_out} is a folder that is not empty: give a new or empty folder (nothing was "
                         "written)")
    place = target if kind == FOLDER else target.parent
    if not new_folders and not place.exists():
        raise UsageError(f"{shown_out}: cannot write: the folder {shown(place)} does not exist: create it or choose "
                         "another place (nothing was written)")
    _refuse_too_long(target, shown_out)  # the link's target's name too
    _refuse_unwritable(place, target, shown_out)
    return out


def _refuse_too_long(target: Path, shown_out: str) -> None:
    """A name in the output's path (its own, or a folder's above it) longer than its file system takes is said to
    be one, not taken for a place that cannot be written. Read from the words of the path, before any look at it
    (every stat of such a path fails)."""
    folder = Path(target.anchor) if target.is_absolute() else Path(".")
    limit = name_limit(folder)
    for part in target.parts[1 if target.is_absolute() else 0:]:
        size = len(os.fsencode(part))
        if size > limit:
            raise UsageError(f"{shown_out}: the name {shown(part[:24])}... is {size} bytes, longer than the {limit} "
                             f"the file system of {shown(folder)} takes: choose a shorter name (nothing was written)")
        folder = folder / part
        if folder.is_dir():
            limit = name_limit(folder)


def _run_file(out: Path) -> str | None:
    """What ``out`` is to the run folder it sits in ("vocabulary", "checkpoints"...), or None."""
    parent = out.parent
    if out.name in RUN_FILES and kind_of(parent) is RUN_FOLDER:
        return RUN_FILES[out.name]
    if out.name in RUN_SUBFOLDERS and kind_of(parent) is RUN_FOLDER:
        return RUN_SUBFOLDERS[out.name]
    for folder in (parent, *parent.parents):
        if folder.name in RUN_SUBFOLDERS and kind_of(folder.parent) is RUN_FOLDER:
            return RUN_SUBFOLDERS[folder.name]
    return None


def _run_of(out: Path) -> Path:
    for folder in (out.parent, *out.parent.parents):
        if kind_of(folder) is RUN_FOLDER:
            return folder
    return out.parent


def _refuse_unwritable(folder: Path, out: Path, shown_out: str) -> None:
    """The nearest folder of ``folder`` (itself or above) that exists must be a folder where a file can be
    created: tried with a temporary of the atomic writer's name for ``out``, removed at once."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{shown_out}: {shown(existing)} is a file, where a folder goes: give another path "
                         "(nothing was written)")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=partial_prefix(out))
    except OSError as exc:
        raise UsageError(f"{shown_out}: cannot write in {shown(existing)} ({exc.strerror or exc}): choose "
                         "another place (nothing was written)") from None
    os.close(fd)
    os.unlink(probe)
