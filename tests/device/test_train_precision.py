"""train.py --precision and --init end to end: fp16 trains with a loss scaler whose overflows are skipped
without counting as failures, the scale is checkpointed and resumed, the mode does not leak, and the
wrong requests are one line."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from numformer import precision  # noqa: E402
from numformer.training import loss_scaling  # noqa: E402
from numformer.checkpoint import load_checkpoint  # noqa: E402


def args(out, steps, *extra):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "5", "--eval-every", "0", "--no-test", "--log-every", "1", "--max-tokens", "800", *extra]


def records(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def test_fp16_training_follows_fp32_and_checkpoints_its_scale(tmp_path):
    assert train.main(args(tmp_path / "f32", 10)) == 0
    assert train.main(args(tmp_path / "f16", 10, "--precision", "fp16")) == 0
    assert precision.get_matmul_precision() == "fp32"  # the mode ends with training
    a, b = records(tmp_path / "f32"), records(tmp_path / "f16")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 11))
    la, lb = np.array([r["train_loss"] for r in a]), np.array([r["train_loss"] for r in b])
    # fp16 operands (11-bit significands) move the loss by far less than training does
    assert np.max(np.abs(la - lb) / la) < 2e-3, (la, lb)
    assert la[-1] < la[0] - 0.5
    assert all(r["loss_scale"] == 2.0 ** 15 and r["overflow_steps"] == 0 for r in b)
    assert "loss_scale" not in a[-1]
    ck = load_checkpoint(tmp_path / "f16" / "checkpoints" / "step_0000010.npz")
    assert ck.meta["loss_scaler"]["scale"] == 2.0 ** 15
    assert json.loads((tmp_path / "f16" / "run.json").read_text())["train_config"]["precision"] == "fp16"
    assert load_checkpoint(tmp_path / "f32" / "checkpoints" / "step_0000010.npz").meta["loss_scaler"] is None


def test_overflow_steps_halve_the_scale_and_are_not_failures(tmp_path, monkeypatch, capsys):
    """A scale of 2**60 overflows float16 at once: the scaler halves it, step after step, until the scaled
    gradients fit; those steps are skipped quietly (no 'not finite' line, not counted towards
    --stop-after-nonfinite 2) and training then reaches --max-steps."""
    real_init = loss_scaling.DynamicLossScaler.__init__

    def huge(self, *a, **k):
        real_init(self, *a, **k)
        self.scale = 2.0 ** 60

    monkeypatch.setattr(loss_scaling.DynamicLossScaler, "__init__", huge)
    out = tmp_path / "run"
    assert train.main(args(out, 6, "--precision", "fp16", "--stop-after-nonfinite", "2")) == 0
    stdout = capsys.readouterr().out
    assert "not finite" not in stdout
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, 7))
    assert recs[0]["overflow_steps"] >= 3  # more than --stop-after-nonfinite, never a failure
    scale = recs[-1]["loss_scale"]
    assert scale < 2.0 ** 60 and np.log2(scale) == int(np.log2(scale))  # halvings of a power of two
    assert all(np.isfinite(r["train_loss"]) for r in recs)

    # the scale (and its overflow count) come back with --resume
    ck = load_checkpoint(out / "checkpoints" / "step_0000006.npz")
    assert ck.meta["loss_scaler"]["scale"] == scale
    monkeypatch.setattr(loss_scaling.DynamicLossScaler, "__init__", real_init)
    assert train.main(["--out", str(out), "--resume", "--max-steps", "8", "--no-progress", "--no-test"]) == 0
    after = [r for r in records(out) if r["step"] > 6]
    assert after and after[0]["loss_scale"] == scale
    assert after[0]["overflow_steps"] == recs[-1]["overflow_steps"]


def test_tf32_on_a_cpu_and_unknown_modes_are_one_line(tmp_path, capsys):
    try:
        code = train.main(args(tmp_path / "run", 2, "--precision", "tf32", "--device", "cpu"))
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("train.py: error:") and "--precision tf32 needs --device cuda" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    with pytest.raises(SystemExit):
        train.parse_args(["--task", "copy", "--precision", "bf8"])


def test_init_flag_reaches_the_model_and_resume_keeps_the_run(tmp_path):
    out = tmp_path / "run"
    assert train.main(args(out, 3, "--init", "xavier")) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["model_config"]["init"] == "xavier"
    # resuming without the flag continues the same run (how weights were first drawn is not checked)
    assert train.main(["--out", str(out), "--resume", "--max-steps", "4", "--no-progress", "--no-test"]) == 0
    assert json.loads((out / "run.json").read_text())["model_config"]["init"] == "xavier"
