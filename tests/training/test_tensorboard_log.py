"""train.py --tensorboard: the event files load in TensorBoard's own reader (EventAccumulator) and hold the
numbers of metrics.jsonl and grad_stats.jsonl, the histograms per layer and the attention images; the
option changes nothing else about the run, costs no host read per step, and without the package it is a
one-line error."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import train

pytest.importorskip("tensorboardX", reason="the tensorboard extra: pip install -e '.[tensorboard]'")
pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[tensorboard]'")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from numformer.run_file_names import step_checkpoint_path  # noqa: E402
from numformer.training.tensorboard_log import attention_image, scalar_tag, tensor_tag  # noqa: E402
from support import load_file_module  # noqa: E402

STEPS, LOG_GRADS, EVAL_EVERY = 20, 10, 10


def _train(out: Path, *extra) -> None:
    assert train.main(["--task", "copy", "--preset", "tiny", "--max-steps", str(STEPS), "--max-tokens", "600",
                       "--out", str(out), "--no-progress", "--no-test", "--log-every", "5", "--save-every", "20",
                       "--log-grads", str(LOG_GRADS), "--eval-every", str(EVAL_EVERY), "--eval-sentences", "4",
                       "--average-last", "1", *extra]) == 0


def _jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run with and without --tensorboard."""
    base = tmp_path_factory.mktemp("tb")
    _train(base / "with", "--tensorboard")
    _train(base / "without")
    return base / "with", base / "without"


@pytest.fixture(scope="module")
def events(runs):
    """The --tensorboard run's event files, read once."""
    return _events(runs[0])


def _events(folder: Path) -> EventAccumulator:
    files = list(folder.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    ea.Reload()
    return ea


def test_scalars_are_the_numbers_of_metrics_jsonl(runs, events):
    ea = events
    metrics = _jsonl(runs[0] / "metrics.jsonl")
    expected = {}
    for record in metrics:
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                expected.setdefault(scalar_tag(key), {})[record["step"]] = float(value)
    for tag in ("train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_s", "valid/loss",
                "valid/bleu"):
        assert tag in expected, tag
    for record in _jsonl(runs[0] / "grad_stats.jsonl"):  # --log-grads steps: the noise scale of grad_stats.jsonl
        noise = record["noise"]
        for group, row in dict(noise["groups"], total=noise["total"]).items():
            for key, tag in (("b_simple", "noise_scale"), ("snr", "gradient_snr")):
                if row[key] is not None:
                    expected.setdefault(f"{tag}/{group}", {})[record["step"]] = row[key]
    assert "noise_scale/total" in expected and "gradient_snr/layernorm" in expected
    assert set(ea.Tags()["scalars"]) == set(expected)
    for tag, by_step in expected.items():
        got = {e.step: e.value for e in ea.Scalars(tag)}
        assert set(got) == set(by_step), tag
        for step, value in by_step.items():  # event files hold float32
            assert math.isclose(got[step], value, rel_tol=1e-6, abs_tol=1e-30), (tag, step, got[step], value)
    assert sorted(expected["valid/loss"]) == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))


def test_histograms_per_layer_hold_every_gradient_of_the_logged_steps(runs, events):
    ea = events
    stats = _jsonl(runs[0] / "grad_stats.jsonl")
    assert [s["step"] for s in stats] == list(range(LOG_GRADS, STEPS + 1, LOG_GRADS))
    tags = set(ea.Tags()["histograms"])
    names = list(stats[0]["params"])
    assert tags == {tensor_tag(n, k) for n in names for k in ("param", "grad")}
    assert "encoder.layers.0/grad/ffn.w_2.weight" in tags and "decoder.layers.1/param/cross_attn.w_o.weight" in tags
    for record in stats:
        for name, row in record["params"].items():
            (event,) = [e for e in ea.Histograms(tensor_tag(name, "grad")) if e.step == record["step"]]
            h = event.histogram_value
            # the histogram's sum of squares is the squared gradient norm grad_stats.jsonl logged
            assert math.isclose(math.sqrt(h.sum_squares), row["grad_norm"], rel_tol=1e-4, abs_tol=1e-12), name
            assert h.max <= row["grad_max"] * (1 + 1e-6) + 1e-30 and -h.min <= row["grad_max"] * (1 + 1e-6) + 1e-30


def test_attention_images_of_each_validation(events):
    ea = events
    want = {f"attention/{kind}_layer{i}" for kind in ("encoder", "decoder", "cross") for i in (1, 2)}
    assert set(ea.Tags()["images"]) == want
    for tag in want:
        events = ea.Images(tag)
        assert [e.step for e in events] == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
        assert events[0].encoded_image_string.startswith(b"\x89PNG") and events[0].width > events[0].height > 0


def test_tensorboard_changes_nothing_else_in_the_run(runs):
    with_tb, without = (_jsonl(r / "metrics.jsonl") for r in runs)
    timing = ("elapsed", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in timing} for r in with_tb] == \
        [{k: v for k, v in r.items() if k not in timing} for r in without]
    assert not list(runs[1].glob("events.out.tfevents.*"))
    a, b = (np.load(next((r / "checkpoints").glob("step_*.npz"))) for r in runs)
    model_keys = [k for k in a.files if k.startswith("model")]
    assert model_keys and all(np.array_equal(a[k], b[k]) for k in model_keys)


def test_attention_image_maps_weights_from_white_to_blue():
    maps = np.zeros((2, 3, 4), dtype=np.float32)
    maps[1, 2, 3] = 1.0
    img = attention_image(maps)
    assert img.shape[0] == 3 and img.min() >= 0 and img.max() <= 1
    cell = img.shape[1] // 3
    assert img.shape[2] == 2 * 4 * cell + cell  # two heads and one gap
    assert np.allclose(img[:, 0, 0], 1.0)  # weight 0: white
    assert img[2, -1, -1] > img[0, -1, -1] + 0.3  # weight 1 (last head, last row and column): blue


def test_missing_package_is_a_one_line_error_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    out = tmp_path / "run"
    code = train.main(["--task", "copy", "--preset", "tiny", "--max-steps", "2", "--out", str(out), "--tensorboard"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'numformer[tensorboard]'" in err, err
    assert not out.exists()


def _host_sync_harness():
    return load_file_module(Path(__file__).resolve().parents[1] / "mpi_worker.py", "mpi_worker")


def test_no_extra_host_read_per_step(monkeypatch, tmp_path):
    """With --tensorboard the scalars come from the metrics line's host floats: still one read per step
    (tests/device/test_host_syncs.py's count, with the CuPy stand-in)."""
    pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
    import cupy_standin as cs

    from numformer.model import Transformer
    from numformer.data.prepared_dataset import PreparedData
    from numformer.presets import get_preset
    from numformer.training.config import TrainConfig
    from numformer.training.trainer import Trainer

    helper = _host_sync_harness()
    xp = cs.install(monkeypatch)
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2), seed=5).to(xp)
    data = PreparedData(helper.TinyVocab(), {}, {"train": helper.pairs(200)}, "task:syncs")
    steps = 4
    cfg = TrainConfig(max_tokens=300, accum=1, warmup=4, max_steps=steps, eval_every=0, log_every=1,
                      save_every=0, save_every_minutes=0, tensorboard=True)
    trainer = Trainer(model, data, cfg, tmp_path, progress=False, log=lambda *a: None)
    at_save = []
    monkeypatch.setattr(trainer, "save", lambda: at_save.append(dict(cs.READS)))
    cs.reset_counts()
    trainer.train()
    assert at_save[0] == {"get": steps}, at_save
    ea = _events(tmp_path)
    assert [e.step for e in ea.Scalars("train/loss")] == list(range(1, steps + 1))


def test_a_resumed_run_hides_the_events_its_checkpoint_does_not_hold(tmp_path):
    """Killed after step 8's log line but before its checkpoint: --resume continues from step 4, and
    TensorBoard shows steps 6 and 8 once, from the resumed run (as metrics.jsonl keeps them once)."""
    out = tmp_path / "run"
    args = ["--task", "copy", "--preset", "tiny", "--max-tokens", "600", "--out", str(out), "--no-progress",
            "--no-test", "--log-every", "2", "--eval-every", "0", "--average-last", "1", "--save-every", "4",
            "--max-steps", "8", "--tensorboard"]
    assert train.main(args) == 0
    step_checkpoint_path(out, 8).unlink()
    assert train.main(args + ["--resume"]) == 0
    assert len(list(out.glob("events.out.tfevents.*"))) == 2
    ea = EventAccumulator(str(out), size_guidance={"scalars": 0})
    ea.Reload()
    metrics = {r["step"]: r["train_loss"] for r in _jsonl(out / "metrics.jsonl") if "train_loss" in r}
    events = ea.Scalars("train/loss")
    assert [e.step for e in events] == sorted(metrics) == [2, 4, 6, 8]
    assert all(math.isclose(e.value, metrics[e.step], rel_tol=1e-6) for e in events)


def test_a_resume_in_the_same_second_keeps_the_first_attempts_event_file(tmp_path, monkeypatch):
    """tensorboardX names an event file by the second it was opened in: a resumed run opened within that
    second must not reuse (and truncate) the first attempt's file. The clock is frozen, so the two opens
    fall in one second on any machine."""
    import time

    from numformer.training.tensorboard_log import TensorBoardLog

    helper = _host_sync_harness()
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    model = _tiny_model()
    data = type("Data", (), {"vocab": helper.TinyVocab(), "ids": {}})()  # no validation pairs: no images
    for start in (0, 4):  # a first attempt, then a resume from step 4's checkpoint
        log = TensorBoardLog(tmp_path, model, data)
        log.open(start)
        log.metrics({"step": start + 2, "train_loss": 1.0})
        log.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/loss")] == [2, 6]


def _tiny_model():
    from numformer.model import Transformer
    from numformer.presets import get_preset

    return Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2), seed=5)
