"""On a GPU (``pytest -m gpu``): the step captured as a CUDA graph and replayed equals the same body run
uncaptured (numformer/training/step_graphs.py), a replay takes new batches, token counts and learning rates
from device memory, and a shape seen once runs uncaptured first. Bit for bit where the order of the sums is
fixed: the first step's loss (a forward from the same weights); from the first gradient on, the embedding's comes
from ``cupyx.scatter_add``'s atomics, whose order of additions differs between runs, so norms, later losses and
weights are compared within rounding (as the CPU rehearsal compares padded and unpadded steps). The CPU rehearsal
of the body and the modelled capture: tests/training/test_step_graphs.py."""
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
from support import no_exact_gradient

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
    losses, norms = [], []
    for _ in range(8):
        results = []
        for trainer in (eager, graphed):
            batches, keys = trainer.training_batches.next_batches(trainer.cfg.accum)
            results.append(trainer.step(batches, keys))
        assert results[0].status is results[1].status is StepStatus.OK
        losses.append((results[0].loss, results[1].loss))
        norms.append((results[0].grad_norm, results[1].grad_norm))
    assert losses[0][0] == losses[0][1]  # the same weights, the same forward: no atomics yet
    for (x, y), (gx, gy) in zip(losses, norms):
        assert y == pytest.approx(x, rel=1e-5) and gy == pytest.approx(gx, rel=1e-4)
    assert not [line for line in logged if "uncaptured" in str(line)], logged
    assert any(step.graph is not None for step in graphed.step_graphs.steps.values())
    for (name, p), q in zip(eager.model.named_parameters(), graphed.model.parameters()):
        if not no_exact_gradient(name):
            a, b = to_host(p.data), to_host(q.data)
            assert np.linalg.norm(a - b) <= 2e-4 * np.linalg.norm(a), name
