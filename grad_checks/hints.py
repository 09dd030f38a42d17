"""``python -m grad_checks hint FILE``: an exercise's derivation, one more step each time it is asked.

Each exercise carries its derivation as steps (``Exercise.steps``), from the easy part to the whole
backward. The count of steps already shown is kept beside the file, in ``.FILE.hints`` (a number), so
that each call reveals one more and repeats the ones before: the student sees the chain so far. The
file itself is only read (its ``EXERCISE = "..."`` line), never run: a file that does not parse yet
still gets its hints.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

from numformer.files import atomic_write_text

from . import exercises


class HintError(ValueError):
    """A hint that cannot be given (no such file, no exercise named); the message is one line."""


def exercise_named_in(path: Path):
    """The exercise a file answers: its ``EXERCISE = "..."`` line, read without running the file, else its
    name (``my_layernorm.py``)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXERCISE" for t in node.targets) \
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return exercises.get(node.value.value)
    except SyntaxError:
        found = re.search(r"^EXERCISE\s*=\s*['\"](\w+)['\"]", text, re.M)
        if found:
            return exercises.get(found.group(1))
    named = re.fullmatch(r"my_(\w+)\.py", path.name)
    if named:
        return exercises.get(named.group(1))
    raise HintError(f"{path} does not say which exercise it answers (no EXERCISE = '...' line)")


def state_file(path: Path) -> Path:
    return path.with_name(f".{path.name}.hints")


def shown_before(path: Path) -> int:
    try:
        return int(state_file(path).read_text().strip())
    except (OSError, ValueError):
        return 0


def hint(path, step: int | None = None, every: bool = False) -> str:
    """The text of the steps up to ``step`` (default: one more than shown before; ``every``: all), the newest
    last; the count shown is recorded beside the file."""
    path = Path(path)
    if not path.is_file():
        raise HintError(f"{path}: no such file (write one with: python -m grad_checks exercise NAME)")
    ex = exercise_named_in(path)
    total = len(ex.steps)
    if total == 0:
        raise HintError(f"the exercise {ex.name} has no hints")
    if every:
        k = total
    elif step is not None:
        if not 1 <= step <= total:
            raise HintError(f"--step {step}: the exercise {ex.name} has steps 1 to {total}")
        k = step
    else:
        k = min(shown_before(path) + 1, total)
    try:
        atomic_write_text(state_file(path), f"{max(k, shown_before(path))}\n", durable=False)
    except OSError as exc:  # a read-only folder (a course's shared one): the hint still shown, the count not kept
        print(f"python -m grad_checks hint: note: cannot keep the count of steps shown beside {path} "
              f"({exc.strerror or exc}): the next hint shows step {k} again; --step K shows the steps up to K",
              file=sys.stderr)
    lines = [f"{ex.title}: the derivation, step {k} of {total}"]
    for i, text in enumerate(ex.steps[:k], 1):
        lines.append(textwrap.fill(text, 100, initial_indent=f"{i}. ", subsequent_indent="   "))
    if k < total:
        lines.append(f"(run it again for step {k + 1}; --all shows the whole derivation)")
    else:
        lines.append(f"(that is the whole derivation; python -m grad_checks check {path} grades your code)")
    return "\n\n".join(lines)
