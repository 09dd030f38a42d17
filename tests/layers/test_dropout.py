"""The plain dropout mask (numformer/layers/dropout.py): its values and its rate."""
import numpy as np

from numformer.backend import RandomState
from numformer.layers.dropout import dropout_mask


def test_dropout_mask_values_and_rate():
    """Kept elements are scaled by 1/(1 - p') with p' = round(p * 2^16) / 2^16; about p' are dropped."""
    mask = dropout_mask(RandomState(5), (200, 1000), 0.1, np.float32)
    threshold = round(0.1 * 65536)
    assert set(np.unique(mask)) == {0.0, np.float32(65536 / (65536 - threshold))}
    assert abs((mask == 0).mean() - threshold / 65536) < 3e-3
