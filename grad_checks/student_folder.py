"""A student's folder of exercise files: which check exact (``exercise --status DIR``), and the layers they
solved, for ``train.py --swap all=DIR``.

A file answers the exercise its ``EXERCISE = "..."`` line names (what ``python -m grad_checks exercise``
writes); ``my_NAME.py`` files come first when two answer the same one. Each is graded as ``check`` grades
it, against numformer's own backward on the exercise's cases, without the finite differences (exactness is
a comparison with numformer's; ``check FILE`` runs both).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numformer.swap import SwapError

from . import exercises
from numformer.user_code_clock import DEFAULT_TIME_LIMIT
from .hints import HintError, exercise_named_in
from .student_file import check_file


@dataclass
class Solved:
    """One exercise in the folder: its file (None when none answers it) and how it grades."""

    exercise: object
    file: Path | None
    state: str          # "exact", "approximate", "wrong", "error", "not implemented", "missing"
    summary: str = ""


def files_by_exercise(folder: Path) -> dict:
    """{exercise name: the file answering it}, ``my_NAME.py`` before any other file naming the same one."""
    found = {}
    for path in sorted(folder.glob("*.py"), key=lambda p: (not p.name.startswith("my_"), p.name)):
        try:
            ex = exercise_named_in(path)
        except (HintError, exercises.UnknownExercise, OSError):
            continue  # not an exercise file: a helper of the student's, say
        found.setdefault(ex.name, path)
    return found


def folder_status(folder, time_limit: float | None = DEFAULT_TIME_LIMIT) -> list:
    """Every exercise, in the order to learn them, with the file in ``folder`` that answers it and its grade
    (each case of each file with ``time_limit`` seconds, as ``check`` gives it: numformer/user_code_clock.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (the exercise files are written with "
                                "python -m grad_checks exercise NAME --out DIR)")
    files = files_by_exercise(folder)
    rows = []
    for ex in exercises.all_exercises():
        path = files.get(ex.name)
        if path is None:
            rows.append(Solved(ex, None, "missing"))
            continue
        result, _, message = check_file(str(path), ex.name, finite_differences=False, time_limit=time_limit)
        if result is None:
            rows.append(Solved(ex, path, "error", message))
        elif result.not_implemented:
            rows.append(Solved(ex, path, "not implemented", result.summary()))
        elif result.exact:
            rows.append(Solved(ex, path, "exact", result.summary()))
        elif result.passed:
            rows.append(Solved(ex, path, "approximate", result.summary()))
        else:
            rows.append(Solved(ex, path, "error" if result.errors else "wrong", result.summary()))
    return rows


def status_table(rows, folder) -> str:
    """The progress of ``folder`` (its :func:`folder_status` rows), a line per exercise, and the count."""
    width = max(len(r.exercise.name) for r in rows)
    lines = []
    for i, r in enumerate(rows, 1):
        where = r.file.name if r.file is not None else \
            f"(no file: python -m grad_checks exercise {r.exercise.name} --out {folder})"
        detail = f"  {r.summary}" if r.summary and r.state != "exact" else ""
        lines.append(f"{i:>2}  {r.exercise.name:<{width}}  {r.state.upper() if r.state == 'exact' else r.state:<15}"
                     f"  {where}{detail}")
    exact = sum(r.state == "exact" for r in rows)
    swappable = [r for r in rows if r.state == "exact" and r.exercise.swap]
    lines.append(f"\n{exact} of {len(rows)} exercises check exact; "
                 + (f"train with the {len(swappable)} layer{'s' if len(swappable) != 1 else ''} among them: python3 train.py --corpus bible-en-es "
                    f"--preset small --max-steps 300 --swap all={folder}"
                    if swappable else "none to train with yet"))
    return "\n".join(lines)


def swap_specs(folder, time_limit: float | None = DEFAULT_TIME_LIMIT) -> tuple:
    """``--swap all=DIR``: (specs ``LAYER=FILE:CLASS`` for every layer solved in ``folder``, lines saying what was
    found). Every file that answers an exercise must grade exact, or this refuses in one line (SwapError):
    a model built from the student's layers is only comparable with numformer's when every one of them is
    right. Exercises with no layer of their own (softmax: attention calls it) are graded but not swapped. Each
    case of each file has ``time_limit`` seconds (numformer/user_code_clock.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SwapError(f"--swap all={folder}: no such folder (write the exercises into it with "
                        "python -m grad_checks exercise NAME --out DIR)")
    rows = [r for r in folder_status(folder, time_limit) if r.state != "missing"]
    if not rows:
        raise SwapError(f"--swap all={folder}: no exercise file in it (python -m grad_checks exercise NAME --out "
                        f"{folder} writes one)")
    bad = [r for r in rows if r.state != "exact"]
    if bad:
        r = bad[0]
        raise SwapError(f"--swap all={folder}: {r.file} does not check exact ({r.state}"
                        + (f": {r.summary}" if r.summary and r.state != "not implemented" else "")
                        + f"): fix it (python -m grad_checks check {r.file}) or move it out of the folder")
    specs = [f"{r.exercise.swap}={r.file}:{r.exercise.layer.__name__}" for r in rows if r.exercise.swap]
    unswapped = [r.exercise.name for r in rows if not r.exercise.swap]
    missing = [ex.name for ex in exercises.all_exercises() if ex.swap and ex.name not in {r.exercise.name for r in rows}]
    lines = [f"swap all={folder}: {len(specs)} layer{'s' if len(specs) != 1 else ''}, every file checks exact"
             + (f"; graded, no layer of their own: {', '.join(unswapped)}" if unswapped else "")
             + (f"; numformer's own (no file): {', '.join(missing)}" if missing else "")]
    return specs, lines
