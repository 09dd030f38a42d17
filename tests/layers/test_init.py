"""Weight initialisation (numformer/layers/init.py): the bounds each scheme promises, and that the model uses them."""
import math

import numpy as np
import pytest

from numformer.layers.init import linear_bound
from numformer.layers.linear import Linear
from numformer.model import Transformer
from numformer.presets import ModelConfig, get_preset


def test_bounds_of_each_scheme_and_role():
    d, f = 256, 1024
    assert linear_bound(d, f, "xavier", "ffn") == pytest.approx(math.sqrt(6 / (d + f)))
    assert linear_bound(d, d, "xavier", "qkv") == pytest.approx(math.sqrt(3 / d))
    # torch.nn.MultiheadAttention: Xavier over the stacked (3d, d) in-projection
    assert linear_bound(d, d, "pytorch", "qkv") == pytest.approx(math.sqrt(6 / (d + 3 * d)))
    # nn.Linear's default: kaiming_uniform_(a=sqrt(5)) = U(+-1/sqrt(fan_in))
    assert linear_bound(d, d, "pytorch", "out") == pytest.approx(1 / math.sqrt(d))
    assert linear_bound(f, d, "pytorch", "ffn") == pytest.approx(1 / math.sqrt(f))
    with pytest.raises(ValueError, match="unknown init scheme"):
        linear_bound(d, d, "he", "ffn")
    with pytest.raises(ValueError, match="unknown linear role"):
        linear_bound(d, d, "xavier", "gate")


def test_drawn_weights_fill_the_bound():
    lin = Linear(512, 2048, rng=np.random.default_rng(0), init="pytorch", role="ffn")
    w, b = lin.weight.data, 1 / math.sqrt(512)
    assert np.abs(w).max() <= b
    assert np.abs(w).max() > 0.999 * b
    assert w.std() == pytest.approx(b / math.sqrt(3), rel=0.01)  # std of U(-b, b)
    assert not lin.bias.data.any()


@pytest.mark.parametrize("scheme", ["pytorch", "xavier"])
def test_model_follows_its_config(scheme):
    cfg = get_preset("tiny", vocab_size=60, d_model=32, d_ff=96, heads=4, init=scheme)
    model = Transformer(cfg, seed=1)
    seen = set()
    for name, module in model.named_modules():
        if not isinstance(module, Linear):
            continue
        role = {"w_q": "qkv", "w_k": "qkv", "w_v": "qkv", "w_o": "out", "w_1": "ffn", "w_2": "ffn"}[name.rsplit(".", 1)[1]]
        bound = linear_bound(module.d_in, module.d_out, scheme, role)
        assert np.abs(module.weight.data).max() <= bound, name
        assert np.abs(module.weight.data).max() > 0.9 * bound, name
        seen.add(role)
    assert seen == {"qkv", "out", "ffn"}


def test_pytorch_is_the_default_and_old_configs_load():
    assert ModelConfig().init == "pytorch"
    old = ModelConfig().to_dict()
    del old["init"]  # run.json files written before the field existed
    assert ModelConfig.from_dict(old).init == "pytorch"
