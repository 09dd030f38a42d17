"""The norms' table (numformer/norms.py) is the one place the residual sub-layers' norm is named: every row is
accepted everywhere a norm is built, counted, mirrored or exported (the config, the Residual and the final norms,
the registry, the parameter count, the PyTorch mirror, CTranslate2's spec, Marian's refusal, the parity and
grad-check cases). tests/checks/test_checklists.py adds a row (RMSNorm, a fixture) and walks the same places."""
import numpy as np
import pytest

from grad_checks.cases import BUILDERS
from numformer.errors import UsageError
from numformer.interop import InteropError
from numformer.interop import ctranslate2 as nct2
from numformer.interop.marian_config import export_refusal
from numformer.layers import Residual
from numformer.layers.registry import layer_class, numformer_classes
from numformer.layers.sublayer import norm_layer
from numformer.model import Transformer
from numformer.norms import NORMS, norm
from numformer.presets import ModelConfig, count_parameters, get_preset

ROWS = list(NORMS)


class _Vocab:
    pad_id = 0


@pytest.mark.parametrize("name", ROWS)
def test_the_config_the_residual_the_final_norms_and_the_registry_take_every_row(name):
    row = NORMS[name]
    cfg = get_preset("tiny", vocab_size=20, norm=name, pre_norm=True)
    assert cfg.norm == name
    assert numformer_classes()[row.layer].__module__ == row.module
    assert type(Residual(4, norm=name).norm) is layer_class(row.layer)
    model = Transformer(cfg)
    norms = [m for n, m in model.named_modules() if n.endswith("norm")]
    assert len(norms) == 2 * cfg.layers + 3 * cfg.n_decoder_layers + 2  # every residual's and both final ones
    assert all(type(m) is layer_class(row.layer) for m in norms)
    # its parameters are the row's, each (d,): what the count, the mirror and the exports read
    layer = norm_layer(name, 6)
    assert [n for n, _ in layer.named_parameters()] == list(row.parameters)
    assert all(p.shape == (6,) for p in layer.parameters())
    assert model.num_parameters() == count_parameters(cfg)
    assert count_parameters(cfg.replace(pre_norm=False)) == Transformer(cfg.replace(pre_norm=False)).num_parameters()


@pytest.mark.parametrize("name", ROWS)
def test_the_mirror_and_the_exports_read_every_row(name):
    torch = pytest.importorskip("torch")
    row = NORMS[name]
    assert callable(getattr(torch.nn.functional, row.torch))
    cfg = get_preset("tiny", vocab_size=20, norm=name)
    if row.ctranslate2 is None:
        with pytest.raises(InteropError, match=f"not {name!r}"):
            nct2.check_exportable(cfg)
    else:
        nct2.check_exportable(cfg)
    assert (export_refusal(cfg, _Vocab()) is None) == row.marian


@pytest.mark.parametrize("name", ROWS)
def test_the_parity_and_grad_check_tables_hold_every_row(name):
    from checks import test_torch_parity as parity

    row = NORMS[name]
    assert row.layer in BUILDERS
    assert (row.layer in parity.CASES) and any(c.startswith("Transformer-") for c in parity.CASES)
    if name != "layernorm":  # LayerNorm's cases are written out; every other row's are made from it
        assert {f"Transformer-{row.layer}-post-LN-dropout", f"Transformer-{row.layer}-untied-pre-LN"} <= set(
            parity.CASES)


def test_an_unknown_norm_is_refused_with_the_tables_names():
    with pytest.raises(UsageError, match="norm must be one of " + ", ".join(ROWS)):
        ModelConfig(norm="batchnorm").checked()
    with pytest.raises(ValueError, match="norm must be one of"):
        norm("batchnorm")
    with pytest.raises(ValueError, match="norm must be one of"):
        Residual(4, norm="batchnorm")


def test_layernorm_is_the_default_and_a_model_file_without_the_field_loads_with_it():
    assert next(iter(NORMS)) == ModelConfig().norm == "layernorm"
    old = ModelConfig().to_dict()
    del old["norm"]
    assert ModelConfig.from_dict(old) == ModelConfig()
    assert np.isclose(count_parameters(get_preset("base", vocab_size=37000)) / 1e6, 63.1, atol=0.05)
