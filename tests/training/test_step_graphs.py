"""The step as CUDA graphs (numformer/training/step_graphs.py), rehearsed on the CPU: the body a graph captures
(batches padded to buckets, the token count and Adam's scalars in device memory, the norm and the fused Adam
on the host emulator, the non-finite verdict made on the device) trains as the uncaptured step does; a step
that cannot be captured runs uncaptured and says why once. The capture itself:
tests/device/test_step_graphs_on_gpu.py."""
import contextlib
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_worker import TinyVocab, pairs
from numformer.data.prepared_dataset import PreparedData
from numformer.kernels.cuda_emulator import emulated
from numformer.model import Transformer
from numformer.presets import get_preset
from numformer.training import step_graphs
from numformer.training.config import TrainConfig
from numformer.training.step_graphs import StepGraphs, bucketed
from numformer.training.step_hooks import StepStatus
from numformer.training.trainer import Trainer
from support import no_exact_gradient

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402


def make_trainer(tmp_path, rehearse: bool, logged=None, dropout=0.0, xp=None, **settings):
    model = Transformer(get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, layers=1, dropout=dropout),
                        seed=5)
    if xp is not None:
        model.to(xp)
    data = PreparedData(TinyVocab(), {}, {"train": pairs(60)}, "task:graphs")
    cfg = TrainConfig(max_tokens=300, accum=2, warmup=4, max_steps=3, eval_every=0, log_every=1, save_every=0,
                      **settings)
    trainer = Trainer(model, data, cfg, tmp_path, progress=False,
                      log=(logged.append if logged is not None else lambda *a: None))
    if rehearse:
        trainer.step_graphs = StepGraphs(trainer, rehearse=True)
    return trainer


def run_steps(trainer, steps=3):
    results = []
    with emulated():
        for _ in range(steps):
            batches, keys = trainer.training_batches.next_batches(trainer.cfg.accum)
            results.append(trainer.step(batches, keys))
    return results


def weights(trainer):
    return np.concatenate([d.astype(np.float64) for d in trainer.optimizer.buffer.data])


@pytest.mark.parametrize("settings", [{}, {"clip_norm": 0.5}])
def test_the_rehearsed_body_trains_as_the_uncaptured_step(tmp_path, settings):
    plain, graphed = make_trainer(tmp_path / "a", False, **settings), make_trainer(tmp_path / "b", True, **settings)
    a, b = run_steps(plain), run_steps(graphed)
    assert [r.status for r in b] == [StepStatus.OK] * 3
    assert graphed.optimizer.step_count == plain.optimizer.step_count == 3
    for x, y in zip(a, b):  # padding moves sums by rounding only
        assert y.loss == pytest.approx(x.loss, rel=1e-5) and y.grad_norm == pytest.approx(x.grad_norm, rel=1e-5)
        assert y.tokens == x.tokens and float(y.nll_sum) == pytest.approx(float(x.nll_sum), rel=1e-5)
    # the weights: Adam turns a rounding difference in a near-zero gradient into a step of up to lr, so per
    # tensor (measured <= 5e-5 of its norm after 3 steps); the key biases hold rounding noise alone (support.py)
    for (name, p), q in zip(plain.model.named_parameters(), graphed.model.parameters()):
        if not no_exact_gradient(name):
            assert np.linalg.norm(p.data - q.data) <= 2e-4 * np.linalg.norm(p.data), name
    assert not any(g.any() for g in graphed.optimizer.buffer.grads)  # zeroed by the fused Adam
    shapes = [s for key in graphed.step_graphs.steps for batch in key[0] for s in batch]
    assert shapes and all(r % 8 == 0 and c % 8 == 0 for r, c in shapes)


def test_a_planted_baked_token_count_is_caught(tmp_path, monkeypatch):
    """The check can fail: a token count written once (as a capture would bake a host number) trains otherwise."""
    plain, graphed = make_trainer(tmp_path / "a", False), make_trainer(tmp_path / "b", True)
    real_load = step_graphs.CapturedStep.load

    def load_once(self, batches, n_tokens, t):
        real_load(self, batches, 1000 if self.sightings > 1 else n_tokens, t)
    monkeypatch.setattr(step_graphs.CapturedStep, "load", load_once)
    a, b = run_steps(plain, 6), run_steps(graphed, 6)
    assert any(y.loss != pytest.approx(x.loss, rel=1e-3) for x, y in zip(a, b))


def test_a_non_finite_step_is_dropped_on_the_device(tmp_path):
    trainer = make_trainer(tmp_path, True)
    run_steps(trainer, 1)
    trainer.optimizer.buffer.data[0][3] = np.nan  # every loss from here on is nan
    before, moments = weights(trainer), trainer.optimizer.m_flat[0].copy()
    result = run_steps(trainer, 1)[0]
    assert result.status is StepStatus.NONFINITE and trainer.optimizer.step_count == 1
    np.testing.assert_array_equal(weights(trainer), before)
    np.testing.assert_array_equal(trainer.optimizer.m_flat[0], moments)
    assert not any(g.any() for g in trainer.optimizer.buffer.grads)


def test_buckets():
    assert [bucketed(n) for n in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 24]


@pytest.mark.parametrize("settings, why", [
    ({}, "CUDA graphs need --device cuda"),
    ({"log_grads": 1}, "gradient statistics"),
    ({"dropout_rng": "batch"}, "per-batch dropout seeds"),
])
def test_a_step_that_cannot_be_captured_runs_uncaptured_and_says_why_once(tmp_path, settings, why):
    logged = []
    trainer = make_trainer(tmp_path, False, logged, **settings)
    trainer.step_graphs = StepGraphs(trainer, rehearse=not settings == {})
    results = run_steps(trainer, 2)
    assert [r.status for r in results] == [StepStatus.OK] * 2
    said = [line for line in logged if "the step runs uncaptured" in str(line)]
    assert len(said) == 1 and why in said[0]


def test_dropout_from_a_host_generator_is_not_captured(tmp_path, monkeypatch):
    """A generator whose state moves on the host would give every replay the captured masks: refused (the GPU's
    counter generator moves on the device). Pretended device arrays and kernels opted in reach that check."""
    logged = []
    trainer = make_trainer(tmp_path, False, logged, dropout=0.1)
    trainer.step_graphs = StepGraphs(trainer)
    monkeypatch.setattr(step_graphs, "is_cupy_array", lambda a: True)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    assert trainer.model.rng.counter is None  # numpy's PCG64 on the host
    assert "advances on the host" in trainer.step_graphs.why_not()
    trainer.model.rng.counter = object()  # a counter on the device: no objection left
    assert trainer.step_graphs.why_not() is None


def test_cuda_graphs_on_a_cpu_is_one_line(tmp_path, capsys):
    code = train.main(["--task", "copy", "--preset", "tiny", "--max-steps", "1", "--out", str(tmp_path / "r"),
                       "--no-progress", "--cuda-graphs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--cuda-graphs needs --device cuda" in err[0]
    assert not (tmp_path / "r").exists()


def test_fp16_rehearsed_body_makes_its_weight_copies_inside_and_trains_as_the_uncaptured_step(tmp_path):
    """With fp16 GEMMs the float16 copies are made by the body (a graph then copies the updated weights at every
    replay); the loss scale is part of the graph's key."""
    from numformer import precision  # noqa: PLC0415

    with precision.matmul_precision("fp16"):
        plain, graphed = make_trainer(tmp_path / "a", False, precision="fp16"), \
            make_trainer(tmp_path / "b", True, precision="fp16")
        a = run_steps(plain)
        casts = precision.half_casts
        b = run_steps(graphed)
    assert [r.status for r in b] == [StepStatus.OK] * 3
    for x, y in zip(a, b):
        assert y.loss == pytest.approx(x.loss, rel=1e-4)
    assert precision.half_casts > casts
    assert all(key[1] == graphed.scaler.scale for key in graphed.step_graphs.steps)


def count_in_the_body(monkeypatch, cs) -> dict:
    """{"reads": [...], "uploads": [...]}: the stand-in's host reads and uploads made inside each run of the
    captured body (not while its inputs are loaded)."""
    counted = {"reads": [], "uploads": []}
    real_body = step_graphs.CapturedStep.body

    def counted_body(self):
        cs.reset_counts()
        real_body(self)
        counted["reads"].append(sum(cs.READS.values()))
        counted["uploads"].append(dict(cs.UPLOADS))
    monkeypatch.setattr(step_graphs.CapturedStep, "body", counted_body)
    return counted


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_captured_body_reads_nothing_back_and_uploads_nothing(tmp_path, monkeypatch, precision):
    """A host value read or uploaded inside the body would be baked into a graph (or refused by the capture):
    on the cupy stand-in, with every fused kernel's wrapper on the host emulator (dropout on, fp16's copies
    made inside), the body reads back and uploads nothing; loading the step's batches is all the uploading."""
    import cupy_standin as cs  # noqa: PLC0415
    from numformer import precision as precisions  # noqa: PLC0415

    xp = cs.install(monkeypatch)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    counted = count_in_the_body(monkeypatch, cs)
    with precisions.matmul_precision(precision):
        trainer = make_trainer(tmp_path, True, dropout=0.1, xp=xp, precision=precision)
        results = run_steps(trainer, 2)
    assert [r.status for r in results] == [StepStatus.OK] * 2
    assert counted["reads"] == [0, 0] and counted["uploads"] == [{}, {}], counted
    assert type(trainer.model.rng.counter) is xp.ndarray


def test_a_planted_read_in_the_body_is_counted(tmp_path, monkeypatch):
    """The check can fail: a loss that reads its token count back to the host (as a float) is seen."""
    import cupy_standin as cs  # noqa: PLC0415
    from numformer.loss import LabelSmoothedCrossEntropy  # noqa: PLC0415

    xp = cs.install(monkeypatch)
    real_forward = LabelSmoothedCrossEntropy.forward
    monkeypatch.setattr(LabelSmoothedCrossEntropy, "forward", lambda self, logits, target, normalizer=None, **kw:
                        real_forward(self, logits, target, normalizer=float(normalizer), **kw))
    trainer = make_trainer(tmp_path, True, xp=xp)
    counted = count_in_the_body(monkeypatch, cs)
    run_steps(trainer, 1)
    assert counted["reads"] and counted["reads"][0] > 0


# -- the capture itself, modelled on the cupy stand-in (tests/cupy_standin.py: what CuPy refuses under a capture
# is refused there; a graph replays its records on the same memory, host values baked in) ------------------------
def standin_trainer(tmp_path, monkeypatch, capture: bool, dropout=0.1, logged=None, **settings):
    import cupy_standin as cs  # noqa: PLC0415

    xp = cs.install(monkeypatch)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    trainer = make_trainer(tmp_path, not capture, logged, dropout=dropout, xp=xp, **settings)
    if capture:
        trainer.step_graphs = StepGraphs(trainer)
    return trainer, cs


def same_batches_steps(trainer, steps, batches=None):
    """``steps`` optimizer steps on the same batches (one shape: the first runs uncaptured, the second captures)."""
    batches = batches or trainer.training_batches.next_batches(trainer.cfg.accum)
    with emulated():
        return [trainer.step(*batches) for _ in range(steps)], batches


def test_today_s_body_is_refused_under_a_capture_with_cupys_message(tmp_path, monkeypatch):
    """The body as it was (every product CuPy's ``@``) cannot be captured: CuPy's cuBLAS wrappers refuse while a
    stream captures, and the stand-in says so with CuPy's own message; the step then runs uncaptured."""
    logged = []
    trainer, cs = standin_trainer(tmp_path, monkeypatch, True, logged=logged)
    monkeypatch.setattr(StepGraphs, "gemms", lambda self, bind=True: contextlib.nullcontext())  # CuPy's own @
    results, _ = same_batches_steps(trainer, 3)
    assert [r.status for r in results] == [StepStatus.OK] * 3
    said = [line for line in logged if "the capture failed" in str(line)]
    assert said == ["the step runs uncaptured: the capture failed (NotImplementedError: calling cuBLAS API during "
                    "stream capture is currently unsupported)"], logged
    assert trainer.step_graphs.broken and not any(s.graph for s in trainer.step_graphs.steps.values())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_captured_body_replays_as_the_uncaptured_body(tmp_path, monkeypatch, precision):
    """On numformer's own cuBLAS handle the body is captured (dropout on: its counter advances on the device), and
    every replay gives the uncaptured body's losses, norms and weights bit for bit."""
    from numformer import precision as precisions  # noqa: PLC0415

    logged = []
    with precisions.matmul_precision(precision):
        eager, cs = standin_trainer(tmp_path / "a", monkeypatch, False, precision=precision)
        a, batches = same_batches_steps(eager, 4)
        graphed, cs = standin_trainer(tmp_path / "b", monkeypatch, True, logged=logged, precision=precision)
        b, _ = same_batches_steps(graphed, 4, batches)
    assert not [line for line in logged if "uncaptured" in str(line)], logged
    (step,) = graphed.step_graphs.steps.values()
    assert step.graph is not None and cs.LAUNCHES["graph launch"] == 3  # steps 2-4 replayed
    assert [(r.loss, r.grad_norm, r.status) for r in a] == [(r.loss, r.grad_norm, r.status) for r in b]
    for x, y in zip(eager.optimizer.buffer.data, graphed.optimizer.buffer.data):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert graphed.model.rng.get_state() == eager.model.rng.get_state()  # the replays moved the counter


def test_a_planted_host_value_is_baked_into_the_graph(tmp_path, monkeypatch):
    """The replay can fail: a token count handed to the loss as a host number is baked in at the capture, and a
    later step with the same shape and another count trains otherwise than the uncaptured body."""
    real_body = step_graphs.CapturedStep.body

    def body_with_a_host_count(self, bound=False):
        real_forward = self.trainer.criterion.forward
        host = float(np.asarray(self.host_count))
        self.trainer.criterion.forward = lambda logits, target, normalizer=None, **kw: real_forward(
            logits, target, normalizer=host, **kw)
        try:
            real_body(self, bound)
        finally:
            del self.trainer.criterion.forward
    real_load = step_graphs.CapturedStep.load

    def load(self, batches, n_tokens, t):
        self.host_count = n_tokens
        real_load(self, batches, n_tokens, t)
    monkeypatch.setattr(step_graphs.CapturedStep, "body", body_with_a_host_count)
    monkeypatch.setattr(step_graphs.CapturedStep, "load", load)
    results = {}
    for capture in (False, True):
        trainer, cs = standin_trainer(tmp_path / str(capture), monkeypatch, capture, dropout=0.0)
        batches, keys = trainer.training_batches.next_batches(trainer.cfg.accum)
        fewer = [dataclasses.replace(batches[0], n_tgt_tokens=batches[0].n_tgt_tokens - 3), *batches[1:]]
        steps, _ = same_batches_steps(trainer, 2, (batches, keys))
        more, _ = same_batches_steps(trainer, 2, (fewer, keys))  # the same shape, another count
        results[capture] = [r.loss for r in steps + more]
    assert results[True][:2] == results[False][:2] and results[True][2] != results[False][2]


def test_every_graph_is_captured_on_one_stream(tmp_path, monkeypatch):
    """One stream for every graph: CuPy's pool keeps a free list per stream, so the scratch of one capture is what
    the next reuses (a stream per graph would pin a step's scratch each)."""
    trainer, cs = standin_trainer(tmp_path, monkeypatch, True)
    streams = []
    real_begin = cs._Stream.begin_capture
    monkeypatch.setattr(cs._Stream, "begin_capture", lambda self, mode=None: (streams.append(self.ptr),
                                                                            real_begin(self, mode))[1])
    with emulated():
        for _ in range(6):
            batches = trainer.training_batches.next_batches(trainer.cfg.accum)
            trainer.step(*batches)
            trainer.step(*batches)
    graphs = trainer.step_graphs
    assert len(streams) >= 2 and set(streams) == {graphs.stream.ptr}
    assert sum(s.graph is not None for s in graphs.steps.values()) == len(streams)


def graph_bytes(tmp_path, monkeypatch) -> int:
    """The graphs' pool bytes after one capture of the first shape."""
    trainer, cs = standin_trainer(tmp_path, monkeypatch, True)
    same_batches_steps(trainer, 2)
    return trainer.step_graphs.memory_bytes()


@pytest.mark.parametrize("full", ["cap", "device"])
def test_a_capture_that_does_not_fit_drops_every_graph_first(tmp_path, monkeypatch, full):
    """The graphs' memory is capped in bytes (or the device is full): a capture past it drops every live graph,
    then frees the pool's blocks, and captures again; the steps train as uncaptured ones do."""
    one = graph_bytes(tmp_path / "one", monkeypatch)
    logged = []
    eager, _ = standin_trainer(tmp_path / "e", monkeypatch, False)
    trainer, cs = standin_trainer(tmp_path / "g", monkeypatch, True, logged=logged)
    graphs = trainer.step_graphs
    if full == "cap":
        graphs.memory_cap = int(1.5 * one)
        graphs.pool.set_limit(size=graphs.memory_cap)
    else:
        monkeypatch.setattr(cs, "DEVICE_BYTES", int(1.5 * one))
    with emulated():
        for _ in range(3):
            batches = trainer.training_batches.next_batches(trainer.cfg.accum)
            for t in (trainer, eager):
                for _ in range(2):
                    t.step(*batches)
    assert graphs.room_made >= 1 and graphs.pool.freed == graphs.room_made
    assert sum(s.graph is not None for s in graphs.steps.values()) == 1
    assert graphs.memory_bytes() <= 1.5 * one
    assert not [line for line in logged if "uncaptured" in str(line)], logged
    for x, y in zip(eager.optimizer.buffer.data, trainer.optimizer.buffer.data):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_step_bigger_than_the_cap_runs_uncaptured_and_says_so(tmp_path, monkeypatch):
    logged = []
    trainer, cs = standin_trainer(tmp_path, monkeypatch, True, logged=logged)
    trainer.step_graphs.pool.set_limit(size=1024)
    results, _ = same_batches_steps(trainer, 3)
    assert [r.status for r in results] == [StepStatus.OK] * 3
    said = [line for line in logged if "does not fit in the graphs' memory" in str(line)]
    assert len(said) == 1 and trainer.step_graphs.broken is None


@pytest.mark.parametrize("planted", ["free first", "cupy's allocator"])
def test_freeing_what_a_live_graph_replays_into_is_caught(tmp_path, monkeypatch, planted):
    """The check can fail: freeing the pool's blocks before dropping the graphs, or a pool on CuPy's own
    allocator (which frees every free block when the device is full), frees memory a live graph replays into."""
    one = graph_bytes(tmp_path / "one", monkeypatch)
    trainer, cs = standin_trainer(tmp_path / "g", monkeypatch, True)
    graphs = trainer.step_graphs
    if planted == "free first":
        graphs.pool.set_limit(size=int(1.5 * one))

        def make_room(keep):
            graphs.pool.free_all_blocks()
        monkeypatch.setattr(graphs, "make_room", make_room)
    else:
        graphs.pool = cs._new_pool()  # CuPy's allocator
        monkeypatch.setattr(cs, "DEVICE_BYTES", int(1.5 * one))
    raised = ""
    try:
        with emulated():
            for _ in range(3):
                batches = trainer.training_batches.next_batches(trainer.cfg.accum)
                trainer.step(*batches)
                trainer.step(*batches)
    except AssertionError as exc:  # the planted make_room raises outside a capture; inside one it breaks the capture
        raised = str(exc)
    assert "live CUDA graph" in (raised or graphs.broken or ""), (raised, graphs.broken)
