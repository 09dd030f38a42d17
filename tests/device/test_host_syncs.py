"""The GPU training loop reads one device value set back to the host per step, and no more.

Every read of a device value on the host (``float(x)``, ``bool(x)``, ``.item()``,
``.get()``, printing) makes the host wait for the GPU to finish all queued work. The
training step needs exactly one such read: the loss and the global gradient norm,
fetched together (``numformer.backend.read_scalars``), for the non-finite check, the
fp16 loss scaler and the log line. The list of every read, and why each is there, is in
``docs/gpu.md`` ("Host syncs in the training step").

The CuPy stand-in (``tests/cupy_standin.py``) makes numformer take numpy arrays for
device arrays and counts each read; ``Trainer.train`` runs whole steps through it
(forward, loss, backward, norm or clipping, the loss scaler, Adam, the log line).
"""
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
pytest.importorskip("cupyx")

import cupy_standin as cs  # noqa: E402
from support import load_file_module  # noqa: E402

STEPS = 4
ACCUM = 2


def tiny_trainer(tmp_path, device, **cfg):
    """A Trainer of a tiny model on ``device`` (an array module or "cuda") for STEPS steps of ACCUM batches, a log
    line every step, no checkpoint before the end: the run both counts go through."""
    from numformer.data.prepared_dataset import PreparedData
    from numformer.model import Transformer
    from numformer.presets import get_preset
    from numformer.training.config import TrainConfig
    from numformer.training.trainer import Trainer

    helper = load_file_module(Path(__file__).resolve().parents[1] / "mpi_worker.py", "mpi_worker")
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=2), seed=5).to(device)
    data = PreparedData(helper.TinyVocab(), {}, {"train": helper.pairs(200)}, "task:syncs")
    cfg = TrainConfig(max_tokens=300, accum=ACCUM, warmup=4, max_steps=STEPS, eval_every=0, log_every=1,
                      save_every=0, save_every_minutes=0, **cfg)
    return Trainer(model, data, cfg, tmp_path, progress=False, log=lambda *a: None)


@pytest.mark.parametrize("precision,clip", [("fp32", 0.0), ("fp32", 1.0), ("fp16", 0.0), ("tf32", 0.0)])
def test_one_host_read_per_training_step(monkeypatch, tmp_path, precision, clip):
    xp = cs.install(monkeypatch)
    trainer = tiny_trainer(tmp_path, xp, clip_norm=clip, precision=precision)
    at_save = []
    # the checkpoint at the end copies every weight to the host on purpose: count up to it
    monkeypatch.setattr(trainer, "save", lambda: at_save.append((dict(cs.READS), dict(cs.UPLOADS))))
    cs.reset_counts()
    trainer.train()

    assert trainer.optimizer.step_count == STEPS
    reads, uploads = at_save[0]
    assert reads == {"get": STEPS}, f"host reads in {STEPS} steps: {reads}"
    # the batch's token ids go to the device: source, decoder input, decoder output per batch
    assert uploads == {"asarray": 3 * ACCUM * STEPS}, uploads
    lines = [ln for ln in (tmp_path / "metrics.jsonl").read_text().splitlines() if ln]
    assert len(lines) == STEPS  # a log line every step, with no extra read for it


def test_the_counter_sees_a_hidden_read(monkeypatch):
    """The count is not vacuous: a float() of a device loss is seen."""
    from numformer.loss import LabelSmoothedCrossEntropy

    xp = cs.install(monkeypatch)
    crit = LabelSmoothedCrossEntropy(0.1)
    logits = xp.asarray(np.random.default_rng(0).standard_normal((2, 3, 5)))
    loss = crit.forward(logits, xp.asarray(np.array([[1, 2, 0], [3, 0, 0]])))
    assert not cs.READS
    float(loss)
    bool(loss > 0)
    assert cs.READS == {"float": 1, "bool": 1}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_one_host_sync_per_training_step_on_the_gpu(monkeypatch, tmp_path, precision):
    """The same count on a real GPU, by cupy itself: the steps run under ``cupyx.allow_synchronize(False)``,
    which raises at any implicit synchronisation (``.get()``, ``float()``, ``bool()`` of a device value), and
    the step's one read (``read_scalars``) is the only place allowed to synchronise. (cupy marks this API
    deprecated since v10; cupy 14.2 on the first GPU machine still had it.)"""
    import cupyx

    from numformer.training import trainer as trainer_module

    trainer = tiny_trainer(tmp_path, "cuda", precision=precision)
    reads = []
    plain_read = trainer_module.read_scalars

    def the_one_read(xp, *values):
        reads.append(len(values))
        with cupyx.allow_synchronize(True):
            return plain_read(xp, *values)

    monkeypatch.setattr(trainer_module, "read_scalars", the_one_read)
    at_save = []
    monkeypatch.setattr(trainer, "save", lambda: at_save.append(len(reads)))  # the checkpoint reads on purpose
    with cupyx.allow_synchronize(False):
        trainer.train()
    assert trainer.optimizer.step_count == STEPS and at_save[0] == STEPS  # one read a step, up to the checkpoint


@pytest.mark.gpu
def test_the_gpu_count_sees_a_hidden_read():
    """The GPU count is not vacuous: a float() or bool() of a device value raises under the same guard."""
    import cupy
    import cupyx

    loss = cupy.ones(()) * 2.0
    for read in (float, bool, lambda x: x.get()):
        with pytest.raises(cupyx.DeviceSynchronized), cupyx.allow_synchronize(False):
            read(loss)
