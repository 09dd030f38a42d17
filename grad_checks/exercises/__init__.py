"""The exercises of ``python -m grad_checks exercise``, one file each, in the order to learn them.

Each file holds one :class:`~grad_checks.exercise.Exercise` (``EXERCISE``): the numformer function
or method to write, the layer that runs it, the cases it is graded on and its catalogue of classic
mistakes, each a small function with the reference's signature. An activation of numformer's table
(numformer.activations) without a file of its own gets the exercise grad_checks/exercises/activation.py makes
from its row, right after the activations that have one.
"""
from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec

from numformer.activations import ACTIVATIONS

# The order to learn them: elementwise, then one matrix, then a row-wise normalisation, the loss,
# the layers with state or statistics (the two tables last: the embedding's scatter-add, then the learned
# positions' sum over the batch), attention, and last the compositions that call the others.
_FILED = ("relu", "silu")
#: the table's activations without a file: their exercise is made from the row (grad_checks/exercises/activation.py)
GENERATED = tuple(n for n in ACTIVATIONS if n not in _FILED and find_spec(f"{__name__}.{n}") is None)
ORDER = (*_FILED, *GENERATED, "linear", "softmax", "loss", "layernorm", "dropout", "embedding", "learned_positions",
         "attention", "multihead", "residual", "encoder_layer", "decoder_layer")


class UnknownExercise(KeyError):
    """No exercise of that name; the message lists them."""


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


def exercise(name: str):
    if name in GENERATED:
        return import_module(f"{__name__}.activation").activation_exercise(name)
    return import_module(f"{__name__}.{name}").EXERCISE


def all_exercises() -> list:
    return [exercise(n) for n in ORDER]


def number(name: str) -> int:
    """1-based position of the exercise in the order to learn them."""
    return ORDER.index(name) + 1
