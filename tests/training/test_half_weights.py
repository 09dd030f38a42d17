"""fp16 as mixed precision does it (issue 60, item 4): the weights' float16 copies made once a step
(numformer.precision.half_weights) give the step's results bit for bit as the per-GEMM casts did, with fewer
casts; outside a training step every GEMM casts as before."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer import precision
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.precision import half_weights, matmul_precision
from numformer.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402

SRC = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
TGT = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])


def model_and_criterion(**kw):
    cfg = get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, dropout=0.0, **kw)
    return Transformer(cfg, seed=0), LabelSmoothedCrossEntropy(0.1)


def step_gradients(copies: bool, batches: int = 2, **kw):
    """Loss and gradients of ``batches`` accumulated passes in fp16, with or without the copies; the casts made."""
    model, crit = model_and_criterion(**kw)
    before = precision.half_casts
    with matmul_precision("fp16"):
        with half_weights(model.parameter_buffer()) if copies else _nothing():
            loss = 0.0
            for _ in range(batches):
                loss += float(crit.forward(model(SRC, TGT[:, :-1]), TGT[:, 1:]))
                model.backward(crit.backward())
    return loss, {n: p.grad.copy() for n, p in model.named_parameters()}, precision.half_casts - before


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=False)])
def test_copies_give_the_per_gemm_casts_results_bit_for_bit_with_fewer_casts(kw):
    loss_cast, grads_cast, casts_cast = step_gradients(False, **kw)
    loss_copy, grads_copy, casts_copy = step_gradients(True, **kw)
    assert loss_copy == loss_cast
    for name, g in grads_cast.items():
        assert np.array_equal(grads_copy[name], g), name
    # every GEMM with a weight operand (forward and dX, twice: two accumulated batches) cast it; now one
    # cast of the whole buffer replaces them
    assert casts_copy < casts_cast - 20, (casts_copy, casts_cast)


def test_a_weight_view_is_taken_from_the_copy_and_anything_else_is_cast():
    model, _ = model_and_criterion()
    w = model.parameters()[3].data
    x = np.random.default_rng(0).standard_normal(w.shape).astype(np.float32)
    with matmul_precision("fp16"), half_weights(model.parameter_buffer()):
        copy = precision._copies[0][2]
        for view in (w, w.T):
            half = precision._half(view)
            assert half.dtype == np.float16 and np.shares_memory(half, copy)
            assert np.array_equal(half, view.astype(np.float16))
        assert not np.shares_memory(precision._half(x), copy)
    assert precision._copies == []  # gone after the step


def test_outside_fp16_or_outside_a_step_nothing_is_copied():
    model, _ = model_and_criterion()
    with half_weights(model.parameter_buffer()):  # fp32: a no-op
        assert precision._copies == []
    with matmul_precision("fp16"):
        assert precision._copies == []


def test_a_planted_stale_copy_is_caught():
    """The check can fail: a copy made before the weights changed gives different gradients."""
    loss_cast, grads_cast, _ = step_gradients(False)
    model, crit = model_and_criterion()
    with matmul_precision("fp16"), half_weights(model.parameter_buffer()):
        precision._copies[0][2][...] *= 1.5  # the copy no longer what the weights are
        crit.forward(model(SRC, TGT[:, :-1]), TGT[:, 1:])
        model.backward(crit.backward())
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert any(not np.array_equal(grads[n], g) for n, g in grads_cast.items())


def test_fp16_training_is_the_same_run_with_the_copies(tmp_path, monkeypatch):
    def run(out):
        common = ["--task", "copy", "--preset", "tiny", "--max-steps", "4", "--out", str(out), "--no-progress",
                  "--eval-every", "0", "--no-test", "--log-every", "1", "--max-tokens", "800", "--precision", "fp16"]
        assert train.main(common) == 0
        return [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]

    with_copies = run(tmp_path / "copies")
    monkeypatch.setattr("numformer.training.trainer.half_weights", lambda buffer: _nothing())
    assert run(tmp_path / "casts") == with_copies
