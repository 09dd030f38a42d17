"""A student's exercise file, loaded and graded: what ``python -m grad_checks check FILE`` does, and what
``exercise --status DIR`` does for each file of a folder.

The file names the exercise it answers (``EXERCISE = "layernorm"``); the student's code is the function
(or, for a composition, the class) the exercise asks for, graded by :func:`grad_checks.grading.grade`.
"""
from __future__ import annotations

from pathlib import Path

from numformer.file_kinds import RUN_FOLDER, kind_of, shown
from numformer.user_code import UserCodeError, load_file

from . import exercises
from numformer.user_code_clock import DEFAULT_TIME_LIMIT, deadline
from numformer.user_code_exits import UserCodeLeft, contained
from .grading import grade

PROG = "python -m grad_checks"


def student_code(module, ex):
    """What the student wrote, or a UserCodeError: for a composition their class (graded whole, with any
    helper methods it has), else their function (graded inside numformer's layer)."""
    if ex.is_method:
        cls = getattr(module, ex.layer.__name__, None)
        if not isinstance(cls, type):
            raise UserCodeError(f"no class {ex.layer.__name__} in the file: it holds your {ex.student_name}")
        if ex.target.__name__ not in vars(cls):
            raise UserCodeError(f"class {ex.layer.__name__} defines no {ex.target.__name__} of its own: write "
                                f"{ex.student_name}")
        return cls
    fn = getattr(module, ex.target.__name__, None)
    if not callable(fn):
        raise UserCodeError(f"no function {ex.target.__name__} in the file: write it (the exercise file has it)")
    return fn


def check_file(path: str, exercise: str | None = None, seed: int = 0, finite_differences: bool = True,
               time_limit: float | None = DEFAULT_TIME_LIMIT):
    """Load and grade one file -> (Grade or None, exit status, message).

    The file's own code (its import) and each case of the grading have ``time_limit`` seconds
    (numformer/user_code_clock.py): code that does not return raises StudentCodeTimeout (exit status 2), naming the
    case and the line of the file it was at."""
    p = Path(path)
    if p.is_dir():  # a folder given for a file: said to be one, with what to pass (not "no such file")
        run = kind_of(p) is RUN_FOLDER
        return None, 2, (f"{shown(p)} is {'a numformer run folder' if run else 'a folder'}, not an exercise file: give "
                         f"the file {PROG} exercise NAME wrote (my_NAME.py); "
                         + (f"to check a trained model's gradients: {PROG} --checkpoint {shown(p)}" if run else
                            f"to grade every file in it: {PROG} exercise --status {shown(p)}"))
    if not p.is_file():
        return None, 2, f"{p}: no such file (write one with: {PROG} exercise NAME)"
    try:  # an exit, a fork, a thread left running...: one line, graded ERROR (numformer/user_code_exits.py)
        with contained(p, "while importing"), deadline(time_limit, f"importing {p}", p):
            module = load_file(p)
    except UserCodeError as exc:
        return None, 1, str(exc)
    name = exercise or getattr(module, "EXERCISE", None)
    if name is None:
        return None, 2, f"{p} does not say which exercise it answers (no EXERCISE = '...' line): pass --exercise NAME"
    ex = exercises.get(str(name))
    try:
        fn = student_code(module, ex)
    except UserCodeError as exc:
        return None, 1, f"{p}: {exc}"
    try:
        with contained(p, "in the graded calls"):
            result = grade(ex, fn, who=f"{ex.student_name} in {p}", file=p, seed=seed,
                           check_command=f"{PROG} check {path}", finite_differences=finite_differences,
                           time_limit=time_limit)
    except UserCodeLeft as exc:
        return None, 1, str(exc)
    return result, 0 if result.passed else 1, ""
