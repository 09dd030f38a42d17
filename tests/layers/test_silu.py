"""SiLU (numformer/layers/silu.py), Marian's feed-forward activation: y = x * sigmoid(x), the sigmoid without
overflow in float32 and float64, the backward's formula, the layer contract, and ModelConfig.activation reaching
every feed-forward block. Gradients: grad_checks (finite differences) and tests/checks/test_torch_parity.py."""
import numpy as np
import pytest

from numformer.layers import FeedForward, ReLU, SiLU
from numformer.layers.registry import layer_class
from numformer.layers.silu import sigmoid, silu_backward, silu_forward
from numformer.model import Transformer
from numformer.presets import get_preset


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sigmoid_neither_overflows_nor_loses_its_dtype(dtype):
    big = np.finfo(dtype).max
    x = np.array([-big, -1e4, -100.0, -20.0, -1.0, 0.0, 1.0, 20.0, 100.0, 1e4, big], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is the right answer
        s = sigmoid(x)
        y, _ = silu_forward(x)
        dx = silu_backward(np.ones_like(x), x, s)
    assert s.dtype == y.dtype == dx.dtype == dtype
    assert np.isfinite(s).all() and np.isfinite(y).all() and np.isfinite(dx).all()
    assert s[0] == 0 and s[-1] == 1 and s[5] == 0.5 and y[-1] == big and dx[-1] == 1 and dx[0] == 0
    np.testing.assert_allclose(s[:-1] + s[::-1][:-1], 1, rtol=4 * np.finfo(dtype).eps)  # s(-x) = 1 - s(x)


def test_forward_and_backward_are_the_formulas():
    x = np.linspace(-12, 12, 97)
    s = 1 / (1 + np.exp(-x))
    dy = np.random.default_rng(0).standard_normal(x.shape)
    m = SiLU()
    np.testing.assert_allclose(m(x), x * s, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(m.backward(dy), dy * (s + x * s * (1 - s)), rtol=1e-13, atol=1e-300)
    assert not m.saved  # backward frees what forward kept
    m.eval()
    m(x)
    assert not m.saved  # eval mode keeps nothing


def test_the_activation_reaches_every_feed_forward_block():
    assert layer_class("SiLU") is SiLU  # registered: swappable like any layer
    cfg = get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, activation="silu")
    ffns = [m for m in Transformer(cfg).modules() if isinstance(m, FeedForward)]
    assert len(ffns) == 4 and all(type(f.activation) is SiLU for f in ffns)
    assert not [m for m in Transformer(cfg).modules() if isinstance(m, ReLU)]
    assert type(FeedForward(8, 16).activation) is ReLU  # the paper's by default
    with pytest.raises(ValueError, match="activation must be one of relu, silu, .*got 'swish'"):
        FeedForward(8, 16, activation="swish")  # Marian's name for it is not numformer's (the table maps it)
