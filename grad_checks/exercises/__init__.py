"""The exercises of ``python -m grad_checks exercise``, one file each, in the order to learn them.

Each file holds one :class:`~grad_checks.exercise.Exercise` (``EXERCISE``): the numformer function
or method to write, the layer that runs it, the cases it is graded on and its catalogue of classic
mistakes, each a small function with the reference's signature. An activation of numformer's table
(numformer.activations) without a file of its own gets the exercise grad_checks/exercises/activation.py makes
from its row.

Nothing lists the exercises by hand: :data:`ORDER` is every file of this folder that defines ``EXERCISE`` and every
activation of the table, each in its place. An exercise says its place itself: its ``stage``, one of
:data:`STAGES`, and within the stage its ``rank`` (then its name; the activations in their table's order). A new
exercise is its file; the listings, the numbering, the counts and the docs' generated sections follow.
"""
from __future__ import annotations

import pkgutil
from importlib import import_module

from numformer.activations import ACTIVATIONS

#: The stages of the order to learn them: elementwise (the activations), then one matrix, a row-wise
#: normalisation, the loss, the norms, the layers with state (dropout's mask), the tables (the embedding's
#: scatter-add, then the learned positions' sum over the batch), attention, the compositions that call the others,
#: and last forward mode (a layer's JVP, then the tangent of its backward: what Hessian-vector products are made of).
STAGES = ("elementwise", "matrix", "row-wise", "loss", "normalisation", "state", "table", "attention",
          "composition", "forward mode")

#: the module of this folder that makes an activation's exercise from its row (it defines no EXERCISE of its own)
_MADE_FROM_ROWS = "activation"

#: the exercises with a file of their own (each module of this folder that defines EXERCISE), by file name
FILED = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                     if not m.name.startswith("_") and m.name != _MADE_FROM_ROWS))
#: the table's activations without a file: their exercise is made from the row (grad_checks/exercises/activation.py)
GENERATED = tuple(n for n in ACTIVATIONS if n not in FILED)


class UnknownExercise(KeyError):
    """No exercise of that name; the message lists them."""


def exercise(name: str):
    if name in GENERATED:
        return import_module(f"{__name__}.{_MADE_FROM_ROWS}").activation_exercise(name)
    return import_module(f"{__name__}.{name}").EXERCISE


def _place(name: str) -> tuple:
    """Where the exercise ``name`` goes: its stage, then its rank in it (an activation's: its row's place in the
    table), then its name. A file naming a stage not in STAGES, or a name not its own, is a bug of that file."""
    ex = exercise(name)
    if ex.name != name:
        raise ValueError(f"grad_checks/exercises/{name}.py defines the exercise {ex.name!r}: name it {name!r}")
    if ex.stage not in STAGES:
        raise ValueError(f"the exercise {name!r} has stage {ex.stage!r}: give it one of {', '.join(STAGES)}")
    within = list(ACTIVATIONS).index(name) if name in ACTIVATIONS else ex.rank
    return STAGES.index(ex.stage), within, name


#: Every exercise, in the order to learn them (``exercise --list``'s numbering).
ORDER = tuple(sorted(FILED + GENERATED, key=_place))


def get(name: str):
    """The exercise called ``name`` (case-insensitive; the layer's class name works too: ``LayerNorm``)."""
    key = name.strip().lower().replace("-", "_")
    if key not in ORDER:
        by_class = {exercise(n).layer.__name__.lower(): n for n in ORDER}
        by_class.update({(exercise(n).swap or "").lower(): n for n in ORDER if exercise(n).swap})
        key = by_class.get(key.replace("_", ""), by_class.get(key, key))
    if key not in ORDER:
        raise UnknownExercise(f"unknown exercise {name!r}: choose from {', '.join(ORDER)} "
                              "(python -m grad_checks exercise --list)")
    return exercise(key)


def all_exercises() -> list:
    return [exercise(n) for n in ORDER]


def number(name: str) -> int:
    """1-based position of the exercise in the order to learn them."""
    return ORDER.index(name) + 1
