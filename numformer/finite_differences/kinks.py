"""Kinks: ReLU is not differentiable at 0, so a probe whose +h and -h forwards see different ReLU active
sets straddles a kink and its difference quotient measures nothing.

:func:`active_set_signature` says which side of every kink a forward saw: a hash of the active set of
every ReLU in the module (:attr:`numformer.layers.relu.ReLU.active_set`, kept by a forward in training
mode). :func:`~numformer.finite_differences.central_differences.run_case` compares it between the two sides of each
probe and drops a probe where it differs.
"""
from __future__ import annotations

import numpy as np


def active_set_signature(module, modules=None) -> int:
    """A hash of the active sets ``[x > 0]`` of every ReLU in ``module`` (any of its ``modules()`` with an
    ``active_set``), after a forward in training mode: two forwards with equal signatures took the same
    branch of every ReLU. ``modules``: the list of them, when the caller walked the tree once already."""
    return hash(b"".join(np.packbits(m.active_set).tobytes()
                         for m in (module.modules() if modules is None else modules)
                         if getattr(m, "active_set", None) is not None))
