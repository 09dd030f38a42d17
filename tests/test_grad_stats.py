"""--log-grads: the logged statistics equal what the model's gradients and weights say at that step."""
import json

import numpy as np

import train
from numformer.grad_stats import GradStats
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import Adam, NoamSchedule
from numformer.plot import main as plot_main
from numformer.plot import plot_run
from numformer.presets import get_preset


def test_logged_norms_equal_direct_norms(tmp_path):
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2), seed=0)
    opt = Adam(model.parameters(), schedule=NoamSchedule(16, 10))
    crit = LabelSmoothedCrossEntropy(0.1)
    stats = GradStats(model, tmp_path / "grad_stats.jsonl")
    src = np.array([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])
    stats.start()
    logits = model(src, tgt[:, :-1])
    stats.after_forward()
    crit.forward(logits, tgt[:, 1:])
    model.backward(crit.backward())
    stats.before_step()
    direct = {n: (np.linalg.norm(p.grad.astype(np.float64)), np.abs(p.grad).max(), p.data.copy())
              for n, p in model.named_parameters()}
    opt.step()
    record = stats.after_step(1)
    assert json.loads((tmp_path / "grad_stats.jsonl").read_text())["step"] == 1
    for name, p in model.named_parameters():
        got = record["params"][name]
        norm, gmax, before = direct[name]
        assert np.isclose(got["grad_norm"], norm, rtol=1e-5), name
        assert np.isclose(got["grad_rms"], norm / np.sqrt(p.grad.size), rtol=1e-5), name
        assert np.isclose(got["grad_max"], gmax, rtol=1e-6), name
        assert np.isclose(got["weight_norm"], np.linalg.norm(p.data.astype(np.float64)), rtol=1e-5), name
        assert np.isclose(got["update_norm"], np.linalg.norm((p.data - before).astype(np.float64)), rtol=1e-4), name
    global_norm = np.sqrt(sum(r["grad_norm"] ** 2 for r in record["params"].values()))
    assert np.isclose(global_norm, np.sqrt(sum(v[0] ** 2 for v in direct.values())), rtol=1e-5)
    acts = record["activations"]
    assert "encoder.layers.0.self_attn_residual" in acts and "decoder.layers.1.ffn_residual" in acts
    assert all(v["std"] > 0 for v in acts.values())  # post-LN outputs: LayerNorm'ed, std near 1
    assert set(record["dead_relu"]) == {f"encoder.layers.{i}.ffn" for i in range(2)} | {
        f"decoder.layers.{i}.ffn" for i in range(2)}
    assert all(0.0 <= v <= 1.0 for v in record["dead_relu"].values())


def test_train_with_log_grads_writes_stats_and_pictures(tmp_path):
    out = tmp_path / "run"
    assert train.main(["--task", "copy", "--preset", "tiny", "--max-steps", "20", "--out", str(out), "--no-progress",
                       "--eval-every", "0", "--no-test", "--log-every", "5", "--max-tokens", "800",
                       "--log-grads", "5", "--save-every", "20"]) == 0
    lines = [json.loads(x) for x in (out / "grad_stats.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [5, 10, 15, 20]
    metrics = {r["step"]: r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
               if "grad_norm" in r}
    for r in lines:  # the trainer's logged global norm is the same gradient
        total = np.sqrt(sum(p["grad_norm"] ** 2 for p in r["params"].values()))
        assert np.isclose(total, metrics[r["step"]]["grad_norm"], rtol=1e-4)
    names = sorted(p.name for p in plot_run(out, tmp_path / "plots"))
    assert names == ["activations.png", "curves.png", "grad_flow.png", "update_ratio.png"]
    assert plot_main(["--compare", str(out), str(out), "--out", str(tmp_path / "cmp.png")]) == 0
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    assert plot_main(["--compare", str(out), str(tmp_path / "plots"), "--out", str(tmp_path / "x.png")]) == 2
