"""A student's folder of exercise files: which check exact (``exercise --status DIR``), and the layers they
solved, for ``train.py --swap all=DIR``.

A file answers the exercise its ``EXERCISE = "..."`` line names (what ``python -m grad_checks exercise``
writes), else the one its name ``my_NAME.py`` names. Each exercise's row grades one file, as ``check`` grades
it, against numformer's own backward on the exercise's cases, without the finite differences (exactness is
a comparison with numformer's; ``check FILE`` runs both). When several files answer one exercise the row
grades ``my_NAME.py``, else the alphabetically first, and says that others answer it; the table then lists
every ``.py`` file it did not grade with the reason (another file answers its exercise, no EXERCISE line, an
unknown exercise, unreadable): a file dropped without a word is work the student believes graded.
``--swap all=DIR`` refuses a folder where two files answer one exercise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from numformer.swap import SwapError

from . import exercises
from numformer.user_code_clock import DEFAULT_TIME_LIMIT
from .hints import HintError, exercise_named_in
from .student_file import check_file


@dataclass
class Solved:
    """One exercise in the folder: its file (None when none answers it), how it grades, and the other files in
    the folder that answer it too (not graded: :class:`FolderFiles` says why)."""

    exercise: object
    file: Path | None
    state: str          # "exact", "approximate", "wrong", "error", "not implemented", "not yours", "missing"
    summary: str = ""
    others: tuple = ()


@dataclass
class NotGraded:
    """A ``.py`` file of the folder that no row of the table grades, and why (one line)."""

    path: Path
    reason: str


@dataclass
class FolderFiles:
    """Every ``.py`` file of a folder, sorted out: the file graded for each exercise, every file answering each
    (the graded one first), and each other file with the reason it is not graded."""

    graded: dict        # exercise name -> the file graded for it
    answering: dict     # exercise name -> [every file answering it], the graded one first
    not_graded: list    # NotGraded, by file name

    def ambiguous(self) -> list:
        """The exercises more than one file answers, in the order to learn them."""
        return [n for n in exercises.ORDER if len(self.answering.get(n, ())) > 1]


def _by_name(path: Path):
    """The exercise ``my_NAME.py`` is named after, or None."""
    named = re.fullmatch(r"my_(\w+)\.py", path.name)
    try:
        return exercises.get(named.group(1)) if named else None
    except exercises.UnknownExercise:
        return None


def _reading(path: Path) -> tuple:
    """(the exercise ``path`` answers, how it says so) or (None, why it answers none): read, never run.

    A ``my_NAME.py`` that cannot be read still answers NAME, so that its row shows the error the grading
    meets instead of calling the exercise missing while its file sits in the folder."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        ex = _by_name(path)
        return (ex, "its name") if ex else (None, f"could not be read: {exc.strerror or exc}")
    # a binary file would read as "no EXERCISE line", which is not why it is not graded (and ast.parse raised
    # ValueError on NUL bytes before Python 3.11.4, which exercise_named_in lets out)
    if b"\0" in data:
        ex = _by_name(path)
        return (ex, "its name") if ex else (None, "could not be read: a binary file (it holds NUL bytes), "
                                                  "not Python source")
    try:
        ex = exercise_named_in(path)
    except HintError:
        return None, "not an exercise file (no EXERCISE line)"
    except exercises.UnknownExercise as exc:
        said = str(exc.args[0]).split(":")[0]  # "unknown exercise 'foo'"
        return None, f"names an {said} (python -m grad_checks exercise --list names them)"
    except (OSError, ValueError) as exc:
        return None, f"could not be read: {exc}"
    said = re.search(r"^EXERCISE\s*=", data.decode("utf-8", errors="replace"), re.M)
    return ex, "EXERCISE line" if said else "its name"


def _count(n: int) -> str:
    return {2: "two", 3: "three"}.get(n, str(n))


def read_folder(folder: Path) -> FolderFiles:
    """Every ``.py`` file of ``folder`` sorted out (:class:`FolderFiles`), the files read, never run.

    The file graded for an exercise is ``my_NAME.py`` when it answers NAME, else the first of the files
    answering it by name: a rule, but one the table states, since a silently ignored file is work the
    student believes graded."""
    answering, how, not_graded = {}, {}, []
    for path in sorted(folder.glob("*.py"), key=lambda p: p.name):
        if path.is_dir():
            continue
        ex, why = _reading(path)
        if ex is None:
            not_graded.append(NotGraded(path, why))
            continue
        answering.setdefault(ex.name, []).append(path)
        how[path] = why
    graded = {}
    for name, paths in answering.items():
        mine = f"my_{name}.py"
        paths.sort(key=lambda p: (p.name != mine, p.name))
        chosen = graded[name] = paths[0]
        for p in paths[1:]:
            if chosen.name == mine:
                why = f"also answers {name} ({how[p]}); graded {mine} instead: {mine} comes first"
            else:
                why = (f"{_count(len(paths))} files answer {name} and {'neither' if len(paths) == 2 else 'none'} "
                       f"is {mine}: graded {chosen.name} (alphabetically first); rename the one you mean to {mine}")
            not_graded.append(NotGraded(p, why))
    not_graded.sort(key=lambda n: n.path.name)
    return FolderFiles(graded, answering, not_graded)


class FolderStatus(list):
    """:func:`folder_status`'s rows (a list, as ``exercise --status`` takes them) with the folder's files sorted
    out (``files``), so that the table lists the files it did not grade from the same reading."""

    files: FolderFiles


def folder_status(folder, time_limit: float | None = DEFAULT_TIME_LIMIT, files: FolderFiles | None = None) -> list:
    """Every exercise, in the order to learn them, with the file in ``folder`` that answers it and its grade
    (each case of each file with ``time_limit`` seconds, as ``check`` gives it: numformer/user_code_clock.py).
    ``files``: the folder already read (:func:`read_folder`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (the exercise files are written with "
                                "python -m grad_checks exercise NAME --out DIR)")
    files = files or read_folder(folder)
    rows = FolderStatus()
    rows.files = files
    for ex in exercises.all_exercises():
        path = files.graded.get(ex.name)
        if path is None:
            rows.append(Solved(ex, None, "missing"))
            continue
        others = tuple(files.answering[ex.name][1:])
        result, _, message = check_file(str(path), ex.name, finite_differences=False, time_limit=time_limit)
        rows.append(Solved(ex, path, _state(result), message if result is None else result.summary(), others))
    return rows


def _state(result) -> str:
    """A grade's row state (:class:`Solved`); None, a file that could not be graded, is an error."""
    if result is None:
        return "error"
    if result.not_yours:  # numformer's own backward used (grad_checks/own_code.py)
        return "not yours"
    if result.not_implemented:
        return "not implemented"
    if result.exact:
        return "exact"
    if result.passed:
        return "approximate"
    return "error" if result.errors else "wrong"


def status_table(rows, folder) -> str:
    """The progress of ``folder`` (its :func:`folder_status` rows): a line per exercise with the file graded, then
    every other ``.py`` file of the folder with why it was not graded, then the count."""
    files = getattr(rows, "files", None) or read_folder(Path(folder))
    width = max(len(r.exercise.name) for r in rows)
    lines = []
    for i, r in enumerate(rows, 1):
        where = r.file.name if r.file is not None else \
            f"(no file: python -m grad_checks exercise {r.exercise.name} --out {folder})"
        if r.others:
            n = len(r.others)
            where += f" ({n} other file{'s' if n != 1 else ''} answer{'s' if n == 1 else ''} it: see below)"
        detail = f"  {r.summary}" if r.summary and r.state != "exact" else ""
        lines.append(f"{i:>2}  {r.exercise.name:<{width}}  {r.state.upper() if r.state == 'exact' else r.state:<15}"
                     f"  {where}{detail}")
    if files.not_graded:
        n = len(files.not_graded)
        named = max(len(f.path.name) for f in files.not_graded)
        lines.append(f"\nnot graded: {'the other' if n == 1 else f'the {n} other'} .py file{'s' if n != 1 else ''} "
                     f"in {folder}")
        lines += [f"    {f.path.name:<{named}}  {f.reason}" for f in files.not_graded]
    exact = sum(r.state == "exact" for r in rows)
    swappable = [r for r in rows if r.state == "exact" and r.exercise.swap]
    twice = files.ambiguous()
    if swappable and twice:  # --swap all=DIR refuses such a folder (swap_specs): say so rather than suggest it
        after = (f"train with the layers among them once one file answers each exercise (more than one answers "
                 f"{', '.join(twice)}: see above)")
    elif swappable:
        after = (f"train with the {len(swappable)} layer{'s' if len(swappable) != 1 else ''} among them: python3 "
                 f"train.py --corpus bible-en-es --preset small --max-steps 300 --swap all={folder}")
    else:
        after = "none to train with yet"
    lines.append(f"\n{exact} of {len(rows)} exercises check exact; {after}")
    return "\n".join(lines)


def swap_specs(folder, time_limit: float | None = DEFAULT_TIME_LIMIT) -> tuple:
    """``--swap all=DIR``: (specs ``LAYER=FILE:CLASS`` for every layer solved in ``folder``, lines saying what was
    found). Every file that answers an exercise must grade exact, or this refuses in one line (SwapError):
    a model built from the student's layers is only comparable with numformer's when every one of them is
    right. So is a folder where two files answer one exercise, before any grading: which one the student
    means to train with is a guess, and a model trained with the other is a wrong experiment that looks right
    (the ``my_NAME.py`` rule picks one for the table, which says so; a run has no such place).
    Exercises with no layer of their own (softmax: attention calls it) are graded but not swapped. Each
    case of each file has ``time_limit`` seconds (numformer/user_code_clock.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SwapError(f"--swap all={folder}: no such folder (write the exercises into it with "
                        "python -m grad_checks exercise NAME --out DIR)")
    files = read_folder(folder)
    twice = files.ambiguous()
    if twice:
        paths = [str(p) for p in files.answering[twice[0]]]
        raise SwapError(f"--swap all={folder}: {_count(len(paths))} files answer {twice[0]}, "
                        f"{', '.join(paths[:-1])} and {paths[-1]}: which one to train with is ambiguous: move the "
                        "one you do not mean out of the folder"
                        + (f" (more than one file answers {', '.join(twice[1:])} too)" if twice[1:] else ""))
    rows = [r for r in folder_status(folder, time_limit, files) if r.state != "missing"]
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
    unused = [f.path.name for f in files.not_graded]
    lines = [f"swap all={folder}: {len(specs)} layer{'s' if len(specs) != 1 else ''}, every file checks exact"
             + (f"; graded, no layer of their own: {', '.join(unswapped)}" if unswapped else "")
             + (f"; numformer's own (no file): {', '.join(missing)}" if missing else "")
             + (f"; not used: {', '.join(unused)} (python -m grad_checks exercise --status {folder} says why)"
                if unused else "")]
    return specs, lines
