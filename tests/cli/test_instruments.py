"""Plots of a run and attention maps: files appear and the recorded attention is a distribution."""
import numpy as np
import pytest

import train
from numformer.attention_maps import attention_pictures
from numformer.checkpoint.trained_model import load_model
from numformer.plot import main as plot_main
from numformer.plot import plot_run
from numformer.picture_data import record_attention


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy")
    assert train.main(["--task", "copy", "--preset", "tiny", "--max-steps", "30", "--out", str(out), "--no-progress",
                       "--eval-every", "15", "--eval-sentences", "5", "--save-every", "15", "--no-test",
                       "--log-every", "5", "--max-tokens", "800"]) == 0
    return out


def test_plot_run_writes_curves(copy_run, tmp_path):
    paths = plot_run(copy_run, tmp_path)
    assert [p.name for p in paths][0] == "curves.png"
    assert all(p.stat().st_size > 10_000 for p in paths)
    assert plot_main([str(tmp_path / "not-a-run")]) == 2


def test_attention_maps(copy_run, tmp_path):
    model, vocab, _ = load_model(copy_run)
    src, tgt = vocab.encode(["a b c d e"])[0], vocab.encode(["a b c d e"])[0]
    maps = record_attention(model, src, tgt, vocab.bos_id, vocab.eos_id)
    n_layers, heads = len(model.encoder.layers), model.cfg.heads
    s, t = len(src) + 1, len(tgt) + 1
    assert [m.shape for m in maps["encoder"]] == [(heads, s, s)] * n_layers
    assert [m.shape for m in maps["cross"]] == [(heads, t, s)] * n_layers
    for kind in maps.values():
        for m in kind:
            np.testing.assert_allclose(m.sum(axis=-1), 1.0, atol=1e-5)
    for m in maps["decoder"]:
        assert np.triu(m, k=1).max() == 0.0  # no query sees a later position
    assert not any(getattr(m, "record_weights", False) for m in model.modules())
    paths = attention_pictures(model, vocab, "a b c d e", tmp_path / "att.png")
    assert sorted(p.name for p in paths) == ["att-cross.png", "att-decoder.png", "att-encoder.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_grad_checks_on_trained_weights(copy_run, capsys):
    import json

    from grad_checks.__main__ import main as gc_main

    assert gc_main(["--checkpoint", str(copy_run), "--layer", "MultiHeadAttention", "--layer", "LayerNorm",
                    "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and report["max_rel_error"] < 1e-6
    assert {r["case"] for r in report["results"]} == {
        "trained encoder.layers.0.self_attn", "trained decoder.layers.0.cross_attn",
        "trained encoder.layers.0.self_attn_residual.norm"}
    assert gc_main(["--checkpoint", str(copy_run / "nope.npz")]) == 2
    assert gc_main(["--checkpoint", str(copy_run), "--layer", "Softmax"]) == 2
    assert "only on random weights" in capsys.readouterr().err
