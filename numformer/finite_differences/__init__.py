"""Finite-difference gradient checks, shared by ``python -m grad_checks`` and the tests.

Three parts, one file each:

* :mod:`~numformer.finite_differences.central_differences`: the core. :class:`GradCase` (a module, its
  inputs, how to run it), :func:`run_case` (float64 central differences against ``backward``, every tensor),
  :func:`rel_error`, :class:`TensorResult`, :func:`analytic_gradients`, :func:`format_results`; the
  method (step, error floor, sampling, directions) is in its docstring;
* :mod:`~numformer.finite_differences.kinks`: which piece of every declared kink (``kinks = True``, the
  layer contract of :class:`numformer.module.Module`: ReLU) a forward saw (:func:`active_set_signature`), so
  a probe straddling one is dropped;
* :mod:`~numformer.finite_differences.any_layer`: :func:`check` (``check(layer, *inputs)``), the same check
  on any object with the layer contract, a user's own layer included, returning a printable
  :class:`CheckReport`; :class:`LayerContractError`, :func:`validate_gradients`, :func:`detached_copy`.

The exercises (``python -m grad_checks exercise``) grade students' backward passes with these.
"""
from .any_layer import CheckReport, LayerContractError, check, detached_copy, validate_gradients
from .central_differences import (TINY, GradCase, TensorResult, analytic_gradients, format_results,
                                  rel_error, run_case)
from .kinks import active_set_signature

__all__ = [
    "TINY", "CheckReport", "GradCase", "LayerContractError", "TensorResult", "active_set_signature",
    "analytic_gradients", "check", "detached_copy", "format_results", "rel_error", "run_case",
    "validate_gradients",
]
