"""On a GPU (``pytest -m gpu``): the step captured as a CUDA graph and replayed equals the same body run
uncaptured (numformer/training/step_graphs.py), a replay takes new batches, token counts and learning rates
from device memory, and a shape seen once runs uncaptured first. The CPU rehearsal of the body:
tests/training/test_step_graphs.py."""
import numpy as np
import pytest

from mpi_worker import TinyVocab, pairs
from numformer.backend import to_host
from numformer.data.prepared_dataset import PreparedData
from numformer.model import Transformer
from numformer.presets import get_preset
from numformer.training.config import TrainConfig
from numformer.training.step_graphs import StepGraphs
from numformer.training.step_hooks import StepStatus
from numformer.training.trainer import Trainer

pytestmark = pytest.mark.gpu


def gpu_trainer(tmp_path, rehearse, logged, dropout=0.0):
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=64, d_ff=128, heads=4, layers=2, dropout=dropout),
                        seed=5).to("cuda")
    data = PreparedData(TinyVocab(), {}, {"train": pairs(200)}, "task:graphs")
    cfg = TrainConfig(max_tokens=300, accum=2, warmup=4, max_steps=8, eval_every=0, log_every=1, save_every=0)
    trainer = Trainer(model, data, cfg, tmp_path, progress=False, log=logged.append)
    trainer.step_graphs = StepGraphs(trainer, rehearse=rehearse)
    return trainer


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_replayed_graphs_equal_the_uncaptured_body(tmp_path, monkeypatch, dropout):
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    logged = []
    eager, graphed = (gpu_trainer(tmp_path / str(r), r, logged, dropout) for r in (True, False))
    for _ in range(8):
        results = []
        for trainer in (eager, graphed):
            batches, keys = trainer.training_batches.next_batches(trainer.cfg.accum)
            results.append(trainer.step(batches, keys))
        assert results[0].status is results[1].status is StepStatus.OK
        assert results[1].loss == results[0].loss and results[1].grad_norm == results[0].grad_norm
    assert not [line for line in logged if "uncaptured" in str(line)], logged
    assert any(step.graph is not None for step in graphed.step_graphs.steps.values())
    for a, b in zip(eager.optimizer.buffer.data, graphed.optimizer.buffer.data):
        assert np.array_equal(to_host(a), to_host(b))
