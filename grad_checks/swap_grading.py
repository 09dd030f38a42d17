"""Grading a layer class swapped in for training (``train.py --swap``), before the first step.

numformer swaps the class in (:mod:`numformer.swap`) and knows nothing of the exercises; ``train.py``
hands :func:`grade_swap` to :func:`numformer.swap.swapped_from_specs`, which logs the line it returns
for each swapped layer. The grade is the exercise's (:func:`grad_checks.grading.grade`, numformer's own
backward on the exercise's cases; no finite differences, so it takes a moment).
"""
from __future__ import annotations

from numformer import user_code_clock as clock
from numformer.swap import SwapError
from numformer.user_code_clock import StudentCodeTimeout

from . import exercises
from .grading import grade
from .student_folder import swap_specs

_GRADED: dict = {}  # (layer, "PATH:CLASS") -> the line, for a layer graded by solved_specs already


def exercise_for(layer: str):
    """The exercise whose answer is a ``layer`` (the name ``--swap`` takes), or None when none is."""
    return next((e for e in exercises.all_exercises() if e.swap == layer), None)


def grade_swap(layer: str, user_class: type, file: str) -> str:
    """One line: where the swapped ``layer`` comes from (``file``: ``"PATH:CLASS"``) and how its backward
    grades against numformer's on the exercise's cases.

    A layer that is not written yet (NotImplementedError) is refused: a SwapError. So is one whose code does
    not return on a case within the default time limit (numformer/user_code_clock.py): training with it would hang
    the same way. A wrong one is trained with anyway, after a warning: seeing what a wrong backward does to
    training is a fair experiment.
    """
    if (layer, file) in _GRADED:
        return _GRADED[(layer, file)]
    where, path = f"swap: {layer} <- {file}", file.rpartition(":")[0]
    exercise = exercise_for(layer)
    if exercise is None:
        return f"{where} (no exercise grades a {layer}: not checked)"
    try:
        # the limit read when called (train.py has no flag for it; a test shortens it here)
        result = grade(exercise, user_class, file=path, finite_differences=False, time_limit=clock.DEFAULT_TIME_LIMIT)
    except StudentCodeTimeout as exc:  # a SwapError, which every process of a data-parallel run raises alike
        raise SwapError(f"--swap {layer}: {file}: {exc.stopped()}: fix it, and check it with "
                        f"python -m grad_checks check {path}") from None
    if result.not_implemented:
        raise SwapError(f"--swap {layer}: {file} is not written yet ({result.not_implemented}): write it, and "
                        f"check it with python -m grad_checks check {path}")
    if result.passed:
        return f"{where}: its backward grades {result.summary()} on {len(result.cases)} cases"
    return (f"{where}: WARNING: its backward grades {result.summary()} (python -m grad_checks check {path} says "
            "more); training with it anyway")


def solved_specs(folder: str) -> tuple:
    """``train.py --swap all=DIR``: (a spec per layer solved in DIR, the lines to log); a file that does not
    check exact, or whose code does not return on a case in time, is refused in one line
    (:func:`grad_checks.student_folder.swap_specs`)."""
    try:
        specs, lines = swap_specs(folder, clock.DEFAULT_TIME_LIMIT)
    except StudentCodeTimeout as exc:
        raise SwapError(f"--swap all={folder}: {exc.stopped()}: fix it, and check it with "
                        f"python -m grad_checks check {exc.file}") from None
    for spec in specs:
        layer, _, file = spec.partition("=")
        _GRADED[(layer, file)] = f"swap: {layer} <- {file}: checked EXACT against numformer's backward"
    return specs, lines
