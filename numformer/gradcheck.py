"""The old name of :mod:`numformer.finite_differences`, kept so that user code written against it
(``from numformer.gradcheck import check``) keeps working; new code imports from
:mod:`numformer.finite_differences`, which this module re-exports whole."""
from .finite_differences import (TINY, CheckReport, GradCase, LayerContractError, TensorResult,
                                 active_set_signature, analytic_gradients, check, detached_copy, format_results,
                                 rel_error, run_case, validate_gradients)

__all__ = [
    "TINY", "CheckReport", "GradCase", "LayerContractError", "TensorResult", "active_set_signature",
    "analytic_gradients", "check", "detached_copy", "format_results", "rel_error", "run_case",
    "validate_gradients",
]
