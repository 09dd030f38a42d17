"""The exercises of ``python -m grad_checks exercise``, one file each, in the order to learn them.

Each file holds one :class:`~grad_checks.exercise.Exercise` (``EXERCISE``): the numformer function
or method to write, the layer that runs it, the cases it is graded on and its catalogue of classic
mistakes, each a small function with the reference's signature.
"""
from __future__ import annotations

from importlib import import_module

# The order to learn them: elementwise, then one matrix, then a row-wise normalisation, the loss,
# the layers with state or statistics (the two tables last: the embedding's scatter-add, then the learned
# positions' sum over the batch), attention, and last the compositions that call the others.
ORDER = ("relu", "silu", "linear", "softmax", "loss", "layernorm", "dropout", "embedding", "learned_positions",
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
    return import_module(f"{__name__}.{name}").EXERCISE


def all_exercises() -> list:
    return [exercise(n) for n in ORDER]


def number(name: str) -> int:
    """1-based position of the exercise in the order to learn them."""
    return ORDER.index(name) + 1
