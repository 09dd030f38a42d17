"""What a cached corpus was built from, and whether that changed since: one record, one comparison.

numformer caches what it builds from a user's files: the WMT 2014 corpus built from ``--wmt-dir``
(:mod:`numformer.data.wmt14`), the bible corpus built from the installed SWORD modules
(:mod:`numformer.data.bible`) and a run's prepared corpus encoded from ``--data DIR`` or a corpus folder
(:mod:`numformer.data.prepared_dataset`). A cache that only remembered *where* its text came from went on serving
the old text after the files there were edited. So each records, when it is built, a fingerprint of its
sources (:func:`fingerprint`)::

    {"files": [{"path": "/abs/train.en", "size": 1234, "mtime_ns": 1717171717123456789}, ...],
     "datasets": [{"name": "wmt/wmt14", "config": "de-en", "version": "1.0.0"}]}

and before it is reused asks :func:`changes` what differs between that record and the sources now; a cache
with a change is built again, and the log line says which source changed (:func:`summary`).

Why size and modification time rather than a hash of the contents: WMT's training text is gigabytes, and
hashing it at every start would cost about a minute; any write changes a file's modification time (an
edit that keeps the size too), as make relies on. What it cannot see is a file replaced by one of the same
size that carries the old modification time (``cp -p``, ``rsync -t`` of another copy): delete the cache
folder then. A dataset of the ``datasets`` library is recorded by name, config and version, which is what
identifies a release of it; it is compared only where its version now is known (see :func:`current`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


def file_record(path) -> dict:
    """``{"path", "size", "mtime_ns"}`` of one source file as it is now (its resolved path, as the caches name
    their source folders; size and mtime None for a file that is not there)."""
    p = Path(path).resolve()
    try:
        st = p.stat()
    except OSError:
        return {"path": str(p), "size": None, "mtime_ns": None}
    return {"path": str(p), "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def dataset_record(name: str, config: str | None, version) -> dict:
    """``{"name", "config", "version"}`` of a dataset of the ``datasets`` library."""
    return {"name": str(name), "config": config, "version": None if version is None else str(version)}


def fingerprint(paths=(), datasets=()) -> dict:
    """The record of a cache's sources: every file of ``paths`` (:func:`file_record`) and every dataset of
    ``datasets`` (:func:`dataset_record` dicts)."""
    out = {"files": [file_record(p) for p in paths]}
    if datasets:
        out["datasets"] = [dict(d) for d in datasets]
    return out


def current(recorded: dict) -> dict:
    """The sources of ``recorded`` as they are now: its files stated again at their recorded paths. Its
    datasets are copied as recorded: their version now is only known by loading them, which a caller that
    does (or that knows it changed) passes to :func:`changes` itself."""
    return fingerprint([f["path"] for f in recorded.get("files", [])], recorded.get("datasets", ()))


def is_fingerprint(value) -> bool:
    """Whether ``value`` is a record :func:`fingerprint` wrote (older caches hold other records, or none)."""
    return isinstance(value, dict) and isinstance(value.get("files"), list)


@dataclass(frozen=True)
class Change:
    """One difference between a cache's record of a source and the source now.

    Attributes:
        source: the file's path, or ``datasets NAME CONFIG``.
        what: ``"is gone"``, ``"is new"``, ``"changed size (120 -> 124 bytes)"``, ``"was modified (same
            size, ...)"``, ``"changed version (1.0.0 -> 2.0.0)"``.
    """

    source: str
    what: str

    @property
    def gone(self) -> bool:
        """The source is no longer there: a cache can be kept (it is all that is left) but not rebuilt."""
        return self.what == "is gone"

    def __str__(self) -> str:
        return f"{self.source} {self.what}"


def changes(recorded: dict, now: dict | None = None) -> list[Change]:
    """Every difference between ``recorded`` (a cache's :func:`fingerprint`) and ``now`` (default: the recorded
    sources as they are now, :func:`current`); an empty list means the cache was built from these sources.
    Files are matched by path, datasets by name and config; order does not matter."""
    now = current(recorded) if now is None else now
    out = []
    before = {f["path"]: f for f in recorded.get("files", [])}
    after = {f["path"]: f for f in now.get("files", [])}
    for path, old in before.items():
        new = after.get(path)
        if new is None or new["size"] is None:
            if old["size"] is not None:
                out.append(Change(path, "is gone"))
        elif old["size"] is None:
            out.append(Change(path, "is new"))
        elif new["size"] != old["size"]:
            out.append(Change(path, f"changed size ({old['size']:,} -> {new['size']:,} bytes)"))
        elif new["mtime_ns"] != old["mtime_ns"]:
            out.append(Change(path, f"was modified (same size, modification time {_when(old['mtime_ns'])} -> "
                                    f"{_when(new['mtime_ns'])})"))
    out += [Change(path, "is new") for path, new in after.items() if path not in before and new["size"] is not None]
    key = lambda d: (d.get("name"), d.get("config"))  # noqa: E731
    old_sets = {key(d): d for d in recorded.get("datasets", [])}
    new_sets = {key(d): d for d in now.get("datasets", [])}
    for k in old_sets.keys() | new_sets.keys():
        name = f"datasets {k[0]} {k[1]}" if k[1] else f"datasets {k[0]}"
        if k not in new_sets:
            out.append(Change(name, "is gone"))
        elif k not in old_sets:
            out.append(Change(name, "is new"))
        elif old_sets[k].get("version") != new_sets[k].get("version"):
            out.append(Change(name, f"changed version ({old_sets[k].get('version')} -> "
                                    f"{new_sets[k].get('version')})"))
    return out


def summary(found: list[Change]) -> str:
    """The changes for one log line: the first in full, the others counted."""
    if not found:
        return "nothing changed"
    more = f" (and {len(found) - 1} more change{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
    return f"{found[0]}{more}"


def _when(mtime_ns: int) -> str:
    """A modification time as a person reads it: local time to the millisecond."""
    seconds, ns = divmod(int(mtime_ns), 1_000_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{ns // 1_000_000:03d}"
