"""The training step and its hooks (numformer/training/step_hooks.py): which hooks a run hangs on the step,
the order they are called in, what a step returns, and that the step stays Section 5's five steps."""
import inspect

import numpy as np
import pytest

from mpi_worker import TinyVocab, pairs
from numformer.data.prepared_dataset import PreparedData
from numformer.model import Transformer
from numformer.presets import get_preset
from numformer.training.config import TrainConfig
from numformer.training.gradient_statistics import GradientStatistics
from numformer.training.step_hooks import (BatchDropoutKeys, LossScaling, StepHook, StepHooks, StepStatus,
                                           finite_status)
from numformer.training.trainer import Trainer


def make_trainer(tmp_path, **settings):
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1), seed=5)
    data = PreparedData(TinyVocab(), {}, {"train": pairs(60)}, "task:hooks")
    cfg = TrainConfig(max_tokens=300, accum=2, warmup=4, max_steps=3, eval_every=0, log_every=1, save_every=0,
                      **settings)
    return Trainer(model, data, cfg, tmp_path, progress=False, log=lambda *a: None)


def test_one_process_with_the_defaults_hangs_nothing_on_the_step(tmp_path):
    assert make_trainer(tmp_path).hooks.hooks == []


@pytest.mark.parametrize("settings, kinds", [
    ({"dropout_rng": "batch"}, [BatchDropoutKeys]),
    ({"precision": "fp16"}, [LossScaling]),
    ({"log_grads": 2}, [GradientStatistics]),
    ({"dropout_rng": "batch", "precision": "fp16", "log_grads": 1}, [BatchDropoutKeys, LossScaling, GradientStatistics]),
])
def test_each_setting_hangs_its_hook_in_the_order_of_the_step(tmp_path, settings, kinds):
    assert [type(h) for h in make_trainer(tmp_path, **settings).hooks.hooks] == kinds


class Recorder(StepHook):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def begin(self, step, keys):
        self.calls.append((self.name, "begin", step))

    def before_forward(self, index, last):
        self.calls.append((self.name, "before_forward", index, last))

    def seed_backward(self, dlogits):
        self.calls.append((self.name, "seed_backward"))
        return dlogits * 2

    def after_backward(self, loss, nll):
        self.calls.append((self.name, "after_backward"))
        return loss + 1, nll

    def before_update(self, step):
        self.calls.append((self.name, "before_update", step))

    def after_update(self, step):
        self.calls.append((self.name, "after_update", step))


def test_hooks_are_called_in_order_and_each_passes_its_result_on():
    calls = []
    hooks = StepHooks(Recorder("a", calls), None, Recorder("b", calls))
    assert len(hooks.hooks) == 2  # None: a hook that is off
    assert hooks.seed_backward(3) == 12 and hooks.after_backward(0.0, 0.0) == (2.0, 0.0)
    assert calls == [("a", "seed_backward"), ("b", "seed_backward"), ("a", "after_backward"), ("b", "after_backward")]
    assert hooks.verdict(1.0, 1.0) is None  # no hook has a say: the finite check decides


def test_the_step_calls_its_hooks_at_their_places_and_returns_its_result(tmp_path):
    trainer = make_trainer(tmp_path)
    calls = []
    trainer.hooks = StepHooks(Recorder("r", calls))
    batches, keys = trainer.training_batches.next_batches(2)
    result = trainer.train_step(batches, keys)
    assert result.status is StepStatus.OK and trainer.optimizer.step_count == 1
    assert result.tokens == sum(b.n_tgt_tokens for b in batches) and np.isfinite(result.loss)
    assert [c[1] for c in calls] == ["begin", "before_forward", "seed_backward", "before_forward", "seed_backward",
                                     "after_backward", "before_update", "after_update"]
    assert calls[0][2] == 1 and calls[1][3] is False and calls[3][3] is True and calls[-1][2] == 1


def test_a_non_finite_step_changes_nothing(tmp_path):
    trainer = make_trainer(tmp_path)
    p = trainer.optimizer.params[0]
    p.data[...] = np.nan
    before = [q.data.copy() for q in trainer.optimizer.params[1:]]
    batches, keys = trainer.training_batches.next_batches(2)
    result = trainer.train_step(batches, keys)
    assert result.status is StepStatus.NONFINITE and trainer.optimizer.step_count == 0
    assert all(np.array_equal(a, q.data) for a, q in zip(before, trainer.optimizer.params[1:]))
    assert all(not q.grad.any() for q in trainer.optimizer.params)  # the gradients are zeroed for the next step
    assert finite_status(1.0, float("inf")) is StepStatus.NONFINITE and finite_status(1.0, 2.0) is StepStatus.OK


def test_the_step_reads_as_section_5():
    """forward, loss, backward, clip, step, in that order, in a body of at most 25 lines."""
    lines = inspect.getsource(Trainer.train_step).splitlines()
    docstring_end = next(i for i, line in enumerate(lines[1:], 1) if line.rstrip().endswith('"""'))
    body = lines[docstring_end + 1:]
    markers = ["# 1. forward", "# 2. loss", "# 3. backward", "# 4. clip", "# 5. Adam step"]
    where = [next(i for i, line in enumerate(body) if m in line) for m in markers]
    assert where == sorted(where)
    assert len([line for line in body if line.strip()]) <= 25
