"""The activations' table (numformer/activations.py) is the one place activations are named: every row is accepted
everywhere an activation is named (the config, FeedForward, the registry and the layer file's functions,
Marian's import and export mapping, CTranslate2's spec, the PyTorch mirror, the parity cases, the grad-check
cases, the exercises), and each name the table gives transformers computes what the mirror computes."""
import numpy as np
import pytest

from grad_checks import exercises
from grad_checks.cases import BUILDERS, build_cases
from numformer import activations
from numformer.errors import UsageError
from numformer.activations import ACTIVATIONS, from_transformers, transformers_names
from numformer.interop import ctranslate2 as nct2
from numformer.interop.marian_config import ACTIVATIONS as MARIAN_IMPORT, MARIAN_ACTIVATION
from numformer.layers import FeedForward
from numformer.layers.registry import layer_class, numformer_classes
from numformer.presets import ModelConfig, get_preset

ROWS = list(ACTIVATIONS)


@pytest.mark.parametrize("name", ROWS)
def test_the_config_the_feed_forward_network_and_the_registry_take_every_row(name):
    row = ACTIVATIONS[name]
    assert ModelConfig(activation=name).checked().activation == name
    assert type(FeedForward(4, 8, activation=name).activation) is layer_class(row.layer)
    assert numformer_classes()[row.layer].__module__ == row.module
    module = __import__(row.module, fromlist=["_"])
    x = np.linspace(-3, 3, 7)
    y, *saved = getattr(module, row.forward_name)(x)
    assert getattr(module, row.backward_name)(np.ones_like(x), *([x] if name != "relu" else []), *saved).shape == x.shape
    nct2.check_exportable(get_preset("tiny", vocab_size=20, activation=name))


def test_an_unknown_name_is_refused_with_the_tables_names():
    with pytest.raises(UsageError, match="activation must be one of " + ", ".join(ROWS)):
        ModelConfig(activation="tanh").checked()
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(4, 8, activation="tanh")
    assert activations.from_transformers("quick_gelu") is None


def test_marians_names_map_both_ways():
    assert set(MARIAN_IMPORT) == set(transformers_names())
    for name, row in ACTIVATIONS.items():
        assert MARIAN_ACTIVATION[name] == row.transformers[0] and MARIAN_IMPORT[row.transformers[0]] == name
        assert all(from_transformers(n) is row for n in row.transformers)


@pytest.mark.parametrize("function", transformers_names())
def test_transformers_computes_under_each_name_what_the_mirror_computes(function):
    """The table's claim: transformers' ACT2FN[name] is the function the mirror calls for the row."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.activations import ACT2FN

    from reference import torch_mirror as tm

    x = torch.linspace(-8, 8, 1601, dtype=torch.float64)
    theirs = ACT2FN[function](x)
    ours = tm.activation(None, "", x, from_transformers(function).name)
    assert torch.allclose(theirs, ours, rtol=1e-14, atol=1e-15), (theirs - ours).abs().max()


@pytest.mark.parametrize("name", ROWS)
def test_ctranslate2_has_each_rows_activation(name):
    pytest.importorskip("ctranslate2")
    from ctranslate2.specs import common_spec

    assert isinstance(getattr(common_spec.Activation, ACTIVATIONS[name].ctranslate2), common_spec.Activation)


@pytest.mark.parametrize("name", ROWS)
def test_the_parity_grad_check_and_exercise_tables_hold_every_row(name):
    from checks import test_torch_parity as parity

    row = ACTIVATIONS[name]
    assert row.layer in parity.CASES and ("FeedForward" if name == "relu" else f"FeedForward-{row.layer}") in parity.CASES
    assert name == "relu" or f"{row.layer}-16x40x1024" in parity.REAL_CASES
    assert row.layer in BUILDERS
    if name != "relu":  # ReLU's feed-forward case is the default FeedForward's
        assert {(c.layer, c.case.endswith(row.layer)) for c in build_cases([row.layer])} == \
            {(row.layer, False), ("FeedForward", True)}
    ex = exercises.get(name)
    assert ex.name == name and ex.layer is layer_class(row.layer) and ex.swap == row.layer
    assert ex.target.__name__ == row.backward_name and name in exercises.ORDER
