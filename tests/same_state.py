"""Shared assertion for the resume and data-parallel tests: two checkpoints hold the same training state."""
import numpy as np

from numformer.checkpoint import load_checkpoint


def assert_same_training_state(path_a, path_b):
    """Every weight and Adam moment of the two checkpoints equal bit for bit, and the same data position."""
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    assert a.model.keys() == b.model.keys()
    for name in a.model:
        assert np.array_equal(a.model[name], b.model[name]), name
    for x, y in zip(a.optimizer["m"] + a.optimizer["v"], b.optimizer["m"] + b.optimizer["v"]):
        assert np.array_equal(x, y)
    assert a.optimizer["step_count"] == b.optimizer["step_count"]
    assert (a.meta["epoch"], a.meta["batch_pos"]) == (b.meta["epoch"], b.meta["batch_pos"])
