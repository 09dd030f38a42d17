"""--log-grads: the logged statistics equal what the model's gradients and weights say at that step."""
import json

import numpy as np

import train
from numformer.training.gradient_statistics import GradientStatistics
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import SQUARES_ROW, Adam, NoamSchedule
from numformer.plot import main as plot_main
from numformer.plot import plot_run
from numformer.presets import get_preset


def float32_norm_rtol(n: int) -> float:
    """The worst relative error of a norm whose n squares are summed in float32 (a row of
    numformer.optim.sum_of_squares, as the instrument and the optimizer do; n = SQUARES_ROW bounds any norm): the sum's is at most n u / (1 - n u) with u = 2**-24 whatever
    the summation order (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Sec. 3.1),
    the square root halves it; read against a float64 sum here. Typical errors are far smaller
    (about sqrt(n) u); the bound holds for every BLAS kernel and thread count."""
    nu = max(n, 1) * 2.0 ** -24
    return nu / (1 - nu)


def test_logged_norms_equal_direct_norms(tmp_path):
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2), seed=0)
    opt = Adam(model.parameters(), schedule=NoamSchedule(16, 10))
    crit = LabelSmoothedCrossEntropy(0.1)
    stats = GradientStatistics(model, tmp_path / "grad_stats.jsonl")
    src = np.array([[5, 6, 7, 3], [8, 9, 3, 0]])
    tgt = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])
    model.zero_grad()
    stats.begin(1, None)  # the step's places, as the trainer's hooks reach them
    stats.before_forward(0, True)
    logits = model(src, tgt[:, :-1])
    stats.after_forward(True)
    crit.forward(logits, tgt[:, 1:])
    model.backward(crit.backward())
    stats.before_update(1)
    direct = {n: (np.linalg.norm(p.grad.astype(np.float64)), np.abs(p.grad).max(), p.data.copy())
              for n, p in model.named_parameters()}
    opt.step()
    stats.after_update(1)
    record = stats.record
    assert json.loads((tmp_path / "grad_stats.jsonl").read_text())["step"] == 1
    for name, p in model.named_parameters():
        got = record["params"][name]
        norm, gmax, before = direct[name]
        rtol = float32_norm_rtol(p.data.size)
        assert np.isclose(got["grad_norm"], norm, rtol=rtol, atol=0), name
        assert np.isclose(got["grad_rms"], norm / np.sqrt(p.grad.size), rtol=rtol, atol=0), name
        assert got["grad_max"] == gmax, name  # a maximum is exact
        assert np.isclose(got["weight_norm"], np.linalg.norm(p.data.astype(np.float64)), rtol=rtol, atol=0), name
        # the update in float32, p.data - before, is the same subtraction in the instrument and here
        assert np.isclose(got["update_norm"], np.linalg.norm((p.data - before).astype(np.float64)), rtol=rtol,
                          atol=0), name
    largest = max(p.data.size for p in model.parameters())
    global_norm = np.sqrt(sum(r["grad_norm"] ** 2 for r in record["params"].values()))
    assert np.isclose(global_norm, np.sqrt(sum(v[0] ** 2 for v in direct.values())), rtol=float32_norm_rtol(largest),
                      atol=0)
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
    for r in lines:  # the trainer's logged global norm is the same gradient: float32 sums of squares over rows
        # of 4,096 (numformer.optim.sum_of_squares) added in float64, the rows cut per tensor here and across
        # the whole gradient buffer there, so they differ by the float32 rounding of row sums (Higham's bound)
        total = np.sqrt(sum(p["grad_norm"] ** 2 for p in r["params"].values()))
        assert np.isclose(total, metrics[r["step"]]["grad_norm"], rtol=float32_norm_rtol(SQUARES_ROW), atol=0)
    for r in lines:  # the noise scale of every sentence of the step (tests/training/test_noise_scale.py: its values)
        assert r["noise"]["sentences"] >= 2 and r["noise"]["total"]["trace"] is not None
        assert set(r["noise"]["tensors"]) == set(r["params"])
        if r["noise"]["total"]["b_simple"] is not None:  # and the total in that step's metrics line
            assert metrics[r["step"]]["noise_scale"] == r["noise"]["total"]["b_simple"]
            assert metrics[r["step"]]["gradient_snr"] == r["noise"]["total"]["snr"]
    assert any("noise_scale" in m for m in metrics.values())
    names = sorted(p.name for p in plot_run(out, tmp_path / "plots"))
    assert names == ["activations.png", "curves.png", "grad_flow.png", "noise_scale.png", "update_ratio.png"]
    assert plot_main(["--compare", str(out), str(out), "--out", str(tmp_path / "cmp.png")]) == 0
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    assert plot_main(["--compare", str(out), str(tmp_path / "plots"), "--out", str(tmp_path / "x.png")]) == 2
