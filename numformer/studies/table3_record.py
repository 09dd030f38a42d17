"""table3's record on disk, which makes the study resumable: one folder per (row, seed), its ``result.json``,
and ``study.json``, the settings every result in the folder shares.

Each finished (row, seed) of Table 3 (Vaswani et al. 2017, Section 6.2) writes
``OUT/table3/ROW-seedS/result.json`` (atomically); a started study reads the finished runs back
(:func:`finished_runs`) and trains only the others. The table is rendered from every finished run in the
folder, whichever ``--rows`` and ``--seeds`` each start asked for, so ``OUT/table3/study.json`` holds what
the results depend on (scale, budget, data and its vocabulary, batch size, schedule, decoding; not the rows
or seeds, which may grow between starts): a start with other settings is refused in one line
(:func:`check_study_file`) rather than mixing results.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError
from ..files import write_json
from ..plot import read_jsonl
from ..presets import TABLE3
from ..run_file_names import METRICS
from .table3_config import NAME

RESULT = "result.json"
STUDY_FILE = "study.json"


def run_folder(out: Path, row: str, seed: int) -> Path:
    return Path(out) / NAME / f"{row}-seed{seed}"


def read_result(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def finished_runs(out: Path) -> dict:
    """Every finished (row, seed) in ``OUT/table3/`` -> its result: the study's record, whichever ``--rows``
    and ``--seeds`` each start asked for (study.json holds the settings they share)."""
    found = {}
    folder = Path(out) / NAME
    for run in sorted(folder.glob("*-seed*")) if folder.is_dir() else ():
        r = read_result(run)
        if isinstance(r, dict) and r.get("row") in TABLE3 and run == run_folder(out, r["row"], r.get("seed")):
            found[(r["row"], r["seed"])] = r
    return found


def check_study_file(out: Path, current: dict) -> None:
    """Write OUT/table3/study.json on the first start; refuse (UsageError) when it holds other settings."""
    path = Path(out) / NAME / STUDY_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        saved = None
    except ValueError:
        raise UsageError(f"{path} is unreadable: delete {path.parent} or use another --out") from None
    if saved is None:
        write_json(path, current)
        return
    diff = [f"{k} {saved.get(k)!r} (now {current.get(k)!r})" for k in sorted(set(saved) | set(current))
            if saved.get(k) != current.get(k)]
    if diff:
        raise UsageError(f"{path.parent} holds table3 results of other settings ({'; '.join(diff[:3])}): use another "
                         f"--out, or delete {path.parent} to start again")


def last_train_loss(folder: Path) -> float | None:
    losses = [r["train_loss"] for r in read_jsonl(folder / METRICS) if "train_loss" in r]
    return losses[-1] if losses else None
