"""Test helper: one float32 run takes another run's ReLU branches.

Two float32 computations of the same model (CPU and GPU, or numformer and a float64 reference)
agree to rounding, except where a ReLU input lies within rounding of zero: there each run may
take the other branch, and every gradient upstream of that unit then differs by far more than
rounding. Which inputs land there depends on the hardware's instructions and BLAS kernels, not
on the code under test, so comparisons replay one run's active sets in the other.
(tests/checks/test_torch_parity.py shows that replaying cannot hide a wrong ReLU.)
"""
from __future__ import annotations

from numformer.backend import get_array_module, to_host
from numformer.layers import ReLU


def record_relu_sets(model) -> dict:
    """Wrap every ReLU of ``model`` so that each forward stores its active set, as a host bool array,
    in the returned dict under the module's name."""
    sets = {}
    for name, mod in model.named_modules():
        if isinstance(mod, ReLU):
            def recording(x, name=name, mod=mod, forward=mod.forward):
                y = forward(x)
                sets[name] = to_host(x > 0).copy()
                return y
            mod.forward = recording  # this instance only
    return sets


def force_relu_sets(model, sets: dict) -> None:
    """Make every ReLU of ``model`` named in ``sets`` use that active set: y = x * set, and backward
    multiplies by the same set (moved to x's device)."""
    for name, mod in model.named_modules():
        if isinstance(mod, ReLU) and name in sets:
            def forced(x, name=name, mod=mod):
                xp = get_array_module(x)
                positive = xp.asarray(sets[name])
                mod.save_for_backward(positive=positive)  # what ReLU's backward reads
                return x * positive.astype(x.dtype)
            mod.forward = forced
