"""The table of fast twins: which fast function stands in for which piece of the plain math, and when.

A kernel file registers each of its functions against a plain function *by its dotted name*
(``@replaces("numformer.layers.layernorm.layernorm_forward", when=on_host)``), so the machinery never
imports the math it replaces: the math calls the switch (:func:`numformer.kernels.kernel`), and an import
the other way would close a circle. ``when`` says which arguments the fast function takes (host arrays,
no dropout); for the others the switch runs the plain function. A twin whose name names no function is a
bug that ``tests/kernels/test_kernels.py`` catches (a renamed piece of math would silently lose its kernel).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..backend import is_cupy_array


@dataclass(frozen=True)
class Twin:
    """A fast function, the arguments it takes (``when``; None: all) and the kernel file it lives in."""

    fast: Callable
    when: Callable | None
    file: str


TWINS: dict = {}  # the plain function's dotted name -> its Twin


def name_of(plain) -> str:
    """``module.qualname`` of a plain function: its key in :data:`TWINS`."""
    return f"{plain.__module__}.{plain.__qualname__}"


def replaces(plain_name: str, when: Callable | None = None):
    """Decorator: register the decorated function as the fast twin of the plain function ``plain_name``,
    taking the arguments for which ``when(*args, **kwargs)`` is true (all when None)."""
    def register(fast):
        TWINS[plain_name] = Twin(fast, when, fast.__module__.rsplit(".", 1)[-1])
        fast.plain_name = plain_name
        return fast
    return register


def on_host(first, *args, **kwargs) -> bool:
    """``when`` of a training kernel: its first argument is a host (numpy) array; a GPU runs the plain math
    (its own kernels do every array operation)."""
    return not is_cupy_array(first)
