"""Data parallelism (numformer/training/distributed.py) on the CPU under ``mpirun -n 2``, and the GPU path under ``-m gpu``.

The MPI tests need Open MPI's ``mpirun`` and ``mpi4py`` (``.ci/setup`` installs both); they start two
processes on two cores (oversubscription allowed, one numformer and BLAS thread each). What they show:

* after several steps both ranks hold bit-identical weights and Adam moments;
* 2 ranks x accum 1 compute what 1 rank x accum 2 computes on the same batches, dropout on, to float64
  rounding (measured differences printed: ``pytest -s``);
* ``--resume`` under mpirun continues to the same weights, bit for bit, as an uninterrupted 2-rank run,
  and only rank 0 writes the run folder;
* a stop asked of one rank (SIGTERM), and a time budget on rank 0's clock, end every rank at the same step;
* a user error is one line from rank 0; without mpirun, mpi4py is never imported.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.checkpoint import load_checkpoint
from numformer.training.data_parallel import GradientBucket, shard_batches
from numformer.training.distributed import SINGLE, init_world
from numformer.training.step_hooks import dropout_seed
from support import ENV, assert_same_training_state, load_file_module, mpirun, no_exact_gradient

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "mpi_worker.py"


def run(cmd, check=True, timeout=240):
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)
    if check and out.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def worker(out, *args, ranks=2):
    """Run tests/mpi_worker.py on ``ranks`` processes (1: without mpirun); per-rank results."""
    cmd = [sys.executable, str(WORKER), str(out), *map(str, args)]
    run(mpirun(ranks) + cmd if ranks > 1 else cmd)
    return [dict(np.load(Path(out) / f"rank{r}.npz")) for r in range(ranks)]


def rel(a, b) -> float:
    """max |a - b| / max |b| over a tensor."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def losses(run_dir):
    return [(r["step"], r["train_loss"]) for r in map(json.loads, (Path(run_dir) / "metrics.jsonl").read_text()
                                                       .splitlines()) if "train_loss" in r]


# -- without MPI ----------------------------------------------------------------------------------------
def test_batches_are_dealt_evenly_by_tokens():
    costs = [900, 100, 800, 200, 700, 300, 650, 350]
    shares = [shard_batches(costs, 2, r) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(8)) and all(len(s) == 4 for s in shares)
    loads = [sum(costs[i] for i in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= 100, loads  # largest first to the lighter rank
    assert shard_batches(costs, 2, 0) == shares[0]  # a pure function: every rank computes the same deal
    assert shard_batches([5, 5, 5, 5], 4, 3) == [3] and shard_batches([7, 3], 1, 0) == [0, 1]
    with pytest.raises(ValueError):
        shard_batches([1, 2, 3], 2, 0)


def test_gradients_live_in_one_buffer():
    from numformer.model import Transformer
    from numformer.presets import get_preset

    model = Transformer(get_preset("tiny", vocab_size=30, d_model=16, d_ff=32, heads=2, layers=1), seed=0)
    params = model.parameters()
    params[0].grad += 1.0
    bucket = GradientBucket(params, extra=2)
    assert bucket.buffer is model.parameter_buffer()  # the model's own buffer: nothing packed twice
    (group,) = bucket.buffer.groups
    assert group.grad.sum() == params[0].size  # existing gradients are kept
    params[1].grad += 2.0  # a backward adding into a gradient adds into the buffer
    assert np.shares_memory(params[1].grad, group.grad) and group.grad.sum() == params[0].size + 2 * params[1].size
    sent = []

    class Recorder:  # one process, recording what the collective is asked to sum
        def allreduce_sum_(self, buf):
            sent.append(buf)
            return buf

    summed = bucket.allreduce_(Recorder(), 1.5, 2.5)
    # one piece here (the model is smaller than a bucket): a view of every gradient and the two scalars, in place
    assert len(sent) == 1 and sent[0].base is group.grad_and_spare and sent[0].size == group.grad_and_spare.size
    sent.clear()
    pieces = GradientBucket(params, extra=2, bucket_elements=100)
    pieces.allreduce_(Recorder(), 1.5, 2.5)  # consecutive views of the buffer, in place, covering it once
    assert len(sent) == -(-group.grad_and_spare.size // 100) and all(s.base is group.grad_and_spare for s in sent)
    assert np.concatenate(sent).tolist() == group.grad_and_spare.tolist()
    assert summed.tolist() == [1.5, 2.5] and group.spare.tolist() == [1.5, 2.5]
    assert bucket.allreduce_(SINGLE, 1.5, 2.5).tolist() == [1.5, 2.5]
    params[2].grad = params[2].grad + 3.0  # a layer that replaces its gradient array would not be summed: a bug
    with pytest.raises(RuntimeError, match="grad is not its view into the parameter buffer"):
        bucket.allreduce_(SINGLE, 1.5, 2.5)


def test_the_frozen_logits_bias_is_rank_zeros_on_every_rank():
    """A persistent buffer (the frozen logits bias) is never updated, so no step keeps the replicas equal on it:
    sync_replicas gives every rank rank 0's, as it does the weights (a stand-in world, no MPI)."""
    from numformer.model import Transformer
    from numformer.optim import Adam
    from numformer.presets import ModelConfig
    from numformer.training.replicas import sync_replicas

    sent = []

    class Rank:  # what rank 0 broadcasts, rank 1 receives
        parallel = True

        def __init__(self, main):
            self.is_main = main

        def broadcast_(self, array):
            if self.is_main:
                sent.append(array.copy())
            else:
                array[...] = sent.pop(0)

        def broadcast_object(self, obj):
            return obj

    cfg = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=1, max_len=16, logits_bias=True)
    zero, one = Transformer(cfg, seed=1), Transformer(cfg, seed=2)
    zero.final_logits_bias[...] = np.arange(13)  # read from a model file by rank 0 alone
    for model, main in ((zero, True), (one, False)):
        sync_replicas(Rank(main), Adam(model.parameters(), lr=1.0), {},
                      [a for _, a in model.named_buffers(persistent_only=True)])
    assert all(np.array_equal(a, b) for a, b in zip(zero.state_dict().values(), one.state_dict().values()))


def test_dropout_seed_depends_on_the_batch_only():
    seeds = {dropout_seed(1, e, p) for e in range(3) for p in range(50)}
    assert len(seeds) == 150 and all(0 <= s < 2 ** 63 for s in seeds)
    assert dropout_seed(1, 2, 3) == dropout_seed(1, 2, 3) != dropout_seed(2, 2, 3)


def test_without_mpirun_nothing_imports_mpi4py(tmp_path):
    code = ("import sys, train\n"
            "from numformer.training.distributed import init_world, SINGLE\n"
            "assert init_world('cpu') is SINGLE\n"
            f"assert train.main(['--task', 'copy', '--preset', 'tiny', '--max-steps', '2', '--out', {str(tmp_path)!r}, "
            "'--no-progress', '--no-test', '--eval-every', '0', '--max-tokens', '400']) == 0\n"
            "assert 'mpi4py' not in sys.modules, 'mpi4py was imported'\n")
    env = {k: v for k, v in ENV.items() if not k.startswith(("OMPI_", "PMI"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert init_world("cpu") is SINGLE  # in this process too (pytest runs without a launcher)


# -- two processes on the CPU ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """8 steps of 2 ranks x accum 1 and of 1 rank x accum 2 on the same batches, dropout 0.1, a checkpoint
    every step, in float64 (see test_two_ranks_equal_one_rank_with_the_whole_batch)."""
    base = tmp_path_factory.mktemp("dp")
    two = worker(base / "two", "--steps", 8, "--accum", 1, "--save-every", 1, "--dtype", "float64")
    one = worker(base / "one", "--steps", 8, "--accum", 2, "--save-every", 1, "--dtype", "float64", ranks=1)
    return base, two, one


def test_both_ranks_hold_identical_parameters(two_ranks):
    _, (r0, r1), _ = two_ranks
    assert r0["step"] == r1["step"] == 8 and r0["size"] == 2
    assert r0.keys() == r1.keys()
    for name in r0:  # every weight and Adam moment, bit for bit, and the data position
        assert np.array_equal(r0[name], r1[name]), name


def test_fp16_ranks_back_off_together_and_stay_identical(tmp_path):
    """fp16 with a scale that overflows at first: the summed gradient is unscaled and checked after the
    allreduce, so both ranks skip the same steps, halve to the same scale and keep identical weights."""
    r0, r1 = worker(tmp_path, "--steps", 4, "--precision", "fp16", "--loss-scale", 2.0 ** 40)
    assert r0["step"] == r1["step"] == 4
    assert r0["overflow_steps"] == r1["overflow_steps"] >= 1
    assert r0["loss_scale"] == r1["loss_scale"] < 2.0 ** 40
    for name in r0:
        assert np.array_equal(r0[name], r1[name]), name


def test_two_ranks_equal_one_rank_with_the_whole_batch(two_ranks):
    """The update of 2 ranks x accum 1 is that of 1 rank x accum 2 on the union of the batches.

    Both runs are in float64. Summing the same gradients in another order (each rank's, then across ranks;
    the tied embedding's three uses; the embedding scatter-add of repeated tokens) changes only rounding;
    in float32 that rounding could put a ReLU input or a near-zero gradient on the other side of zero
    (Adam's first steps move every weight by about the learning rate times the sign of its gradient), and
    the runs would part by more than rounding at a place that depends on the CPU's arithmetic. In float64
    they agree after one step within 1e-13 relative (measured 9.9e-17) and after 8 steps within 1e-11
    (weights, measured 9.6e-15) and 1e-12 (logits and losses, measured 6.7e-16 and equal), except the
    key biases: their exact gradient is zero (softmax ignores a shift of a whole row of scores), so what
    they hold is round-off that Adam scales up to the learning rate, in either run, and they do not
    change any output (the logits agree). Bit-identical ranks in float32 are checked by the fp16 and
    resume tests.
    """
    base, (r0, _), (one,) = two_ranks
    assert one["size"] == 1 and one["step"] == 8
    a = load_checkpoint(base / "two" / "checkpoints" / "step_0000001.npz")
    b = load_checkpoint(base / "one" / "checkpoints" / "step_0000001.npz")
    first = max(rel(a.model[k], b.model[k]) for k in a.model)
    params = [k for k in r0 if k.startswith("param/") and not no_exact_gradient(k)]
    weights = max(rel(r0[k], one[k]) for k in params)
    logits = rel(r0["logits"], one["logits"])
    curve_a, curve_b = losses(base / "two"), losses(base / "one")
    loss = max(abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(curve_a, curve_b))
    print(f"\n2 ranks x accum 1 vs 1 rank x accum 2 (float64, dropout 0.1): after 1 step weights max rel diff {first:.2e}; "
          f"after 8 steps weights {weights:.2e} (key biases left out), logits {logits:.2e}, losses {loss:.2e}")
    assert [s for s, _ in curve_a] == [s for s, _ in curve_b] == list(range(1, 9))
    assert first < 1e-13
    assert logits < 1e-12 and loss < 1e-12 and weights < 1e-11
    assert (r0["epoch"], r0["batch_pos"]) == (one["epoch"], one["batch_pos"]) == (0, 16)


def test_a_stop_asked_of_one_rank_stops_all_at_the_same_step(tmp_path):
    """SIGTERM to rank 1 while it computes step 3: both ranks finish step 3, rank 0 saves it, both report it."""
    r0, r1 = worker(tmp_path, "--steps", 20, "--signal-at", 3, "--signal-rank", 1)
    assert r0["step"] == r1["step"] == 3 and r0["interrupted"] and r1["interrupted"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000003.npz"]


def test_sigusr1_to_mpirun_stops_every_rank_cleanly(tmp_path):
    """mpirun kills the job on SIGINT/SIGTERM but forwards SIGUSR1: every rank finishes the same step,
    rank 0 saves it, all exit normally."""
    import signal
    import time

    cmd = mpirun() + [sys.executable, str(WORKER), str(tmp_path), "--steps", "100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    metrics, deadline = tmp_path / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in range(2))
    assert r0["interrupted"] and r1["interrupted"] and r0["step"] == r1["step"] >= 3
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f"step_{int(r0['step']):07d}.npz"]


def test_the_time_budget_is_rank_zeros_clock(tmp_path):
    r0, r1 = worker(tmp_path, "--max-minutes", 0.004)
    assert r0["step"] == r1["step"] >= 1
    assert r0["elapsed"] == r1["elapsed"] >= 0.24


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """train.py under mpirun -n 2, uninterrupted: 6 steps on the copy task, checkpoints at 3 and 6."""
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = run(mpirun() + train_cmd(out, 6))
    return out, proc


def train_cmd(out, steps, *extra):
    return [sys.executable, "train.py", "--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out",
            str(out), "--save-every", "3", "--eval-every", "0", "--no-test", "--log-every", "1", "--max-tokens", "800",
            "--average-last", "1", "--no-progress", *extra]


def test_train_py_under_mpirun_writes_the_run_from_rank_zero(whole_run):
    out, proc = whole_run
    assert proc.stdout.count("data: task:copy") == 1 and proc.stdout.count("trained 6 steps") == 1, proc.stdout
    assert "data parallel: 2 processes (mpi)" in proc.stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_0000003.npz", "step_0000006.npz"]
    assert [s for s, _ in losses(out)] == [1, 2, 3, 4, 5, 6]  # one metrics file, each step once
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["processes"] == 2 and run_json["train_config"]["dropout_rng"] == "batch"
    ck = load_checkpoint(out / "checkpoints" / "step_0000006.npz")
    assert (ck.meta["epoch"], ck.meta["batch_pos"]) == (0, 12)  # 2 ranks x 1 batch per step


def test_resume_under_mpirun_continues_the_same_run(whole_run, tmp_path):
    out, _ = whole_run
    parts = tmp_path / "run"
    run(mpirun() + train_cmd(parts, 3))
    proc = run(mpirun() + train_cmd(parts, 6, "--resume"))
    assert "resumed from step_0000003.npz" in proc.stdout
    assert_same_training_state(out / "checkpoints" / "step_0000006.npz", parts / "checkpoints" / "step_0000006.npz")
    assert losses(out) == losses(parts)


def test_a_user_error_under_mpirun_is_one_line(whole_run, tmp_path):
    out, _ = whole_run
    proc = run(mpirun() + train_cmd(out, 9), check=False)  # the folder holds a run and --resume is missing
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train.py")]
    assert lines == [f"train.py: error: {out} already holds a run: pass --resume to continue it or choose another "
                     "--out"], proc.stderr
    assert "Traceback" not in proc.stderr
    code = ("import sys; sys.modules['mpi4py'] = None; sys.argv[0] = 'train.py'; import train; "
            f"sys.exit(train.main(['--task', 'copy', '--max-steps', '1', '--out', {str(tmp_path / 'x')!r}]))")
    proc = run(mpirun() + [sys.executable, "-c", code], check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train.py")]
    assert proc.returncode == 2 and len(lines) == 1 and "pip install mpi4py" in lines[0], proc.stderr


def test_a_folder_in_use_stops_every_rank_with_one_line(tmp_path):
    """The ranks of one run share rank 0's lock of the run folder (every run above trains under it, rank 1
    never touching the folder); a folder another process holds stops every rank: one line from rank 0,
    naming the holder, exit 2."""
    from numformer.training.run_lock import lock_run_folder  # noqa: PLC0415

    out = tmp_path / "run"
    lock = lock_run_folder(out)  # this test's process holds the folder
    try:
        proc = run(mpirun() + train_cmd(out, 2), check=False)
    finally:
        lock.release()
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train.py")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"is in use by process {os.getpid()} " in lines[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # nothing else was written


# -- GPUs: NCCL (skipped without cupy and CUDA) ---------------------------------------------------------
@pytest.mark.gpu
def test_nccl_allreduce_and_broadcast_on_one_gpu():
    """The NCCL world's calls on a one-rank communicator (runs on any machine with one GPU)."""
    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    from numformer.training.distributed import NCCLWorld

    world = NCCLWorld(MPI.COMM_SELF, MPI, "cuda:0", cupy, nccl)
    buf = cupy.arange(10, dtype=cupy.float32)
    world.allreduce_sum_(buf)
    assert cupy.asnumpy(buf).tolist() == list(range(10))
    assert world.allreduce_scalars([1.0, 2.0]).tolist() == [1.0, 2.0]
    world.broadcast_(buf)
    assert world.broadcast_object({"a": 1}) == {"a": 1}


def trained_alone_and_on_a_one_rank_world(tmp_path, world, device):
    """The parameters after 4 steps of the plain one-process trainer and of the data-parallel path on ``world``
    (one rank: gradient bucket, allreduce of gradients and loss, broadcasts), from the same start.

    Both draw dropout masks per batch (``dropout_rng="batch"``, what every parallel run uses): the plain
    trainer's default, one stream per run, gives other masks. float64: the two paths may sum in another
    order, and in float32 Adam's first steps (about the learning rate times the sign of each gradient) would
    part runs at a near-zero gradient."""
    from numformer.backend import to_host
    from numformer.data.prepared_dataset import PreparedData
    from numformer.model import Transformer
    from numformer.presets import get_preset
    from numformer.training.config import TrainConfig
    from numformer.training.trainer import Trainer

    helper = load_file_module(WORKER, "mpi_worker")
    results = []
    for w in (None, world):
        model = Transformer(get_preset("tiny", vocab_size=40, d_model=32, d_ff=64, heads=4, layers=2), seed=5,
                            dtype=np.float64).to(device)
        data = PreparedData(helper.TinyVocab(), {}, {"train": helper.pairs(200)}, "task:worker")
        cfg = TrainConfig(max_tokens=300, accum=2, warmup=4, max_steps=4, eval_every=0, log_every=1, save_every=0,
                          dropout_rng="batch")
        Trainer(model, data, cfg, tmp_path / str(w is None), progress=False, world=w).train()
        results.append({n: to_host(p.data) for n, p in model.named_parameters()})
    return results


def assert_same_training(alone, world):
    """Equal within float64 rounding, except the key biases: their exact gradient is zero (softmax ignores a
    shift of a whole row of scores), so they hold round-off that Adam scales up, in either run."""
    names = [n for n in alone if not no_exact_gradient(n)]
    assert len(names) < len(alone)
    worst = max(np.linalg.norm(world[n] - alone[n]) / np.linalg.norm(alone[n]) for n in names)
    assert worst < 1e-10, worst


def test_mpi_training_step_matches_one_process_on_one_rank(tmp_path):
    """The data-parallel path on a one-rank MPI world (CPU) trains exactly like the plain trainer."""
    pytest.importorskip("mpi4py", reason="the mpi extra")
    from mpi4py import MPI

    from numformer.training.distributed import MPIWorld

    assert_same_training(*trained_alone_and_on_a_one_rank_world(tmp_path, MPIWorld(MPI.COMM_SELF, MPI, "cpu"), "cpu"))


@pytest.mark.gpu
def test_nccl_training_step_matches_one_process_on_one_gpu(tmp_path):
    """The same on a one-rank NCCL world (GPU)."""
    import cupy
    from cupy.cuda import nccl
    from mpi4py import MPI

    from numformer.training.distributed import NCCLWorld

    world = NCCLWorld(MPI.COMM_SELF, MPI, "cuda:0", cupy, nccl)
    assert_same_training(*trained_alone_and_on_a_one_rank_world(tmp_path, world, "cuda"))


@pytest.mark.gpu
def test_two_gpus_under_mpirun_hold_identical_parameters(tmp_path):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    r0, r1 = worker(tmp_path, "--steps", 6, "--device", "cuda")
    assert r0["step"] == r1["step"] == 6
    for name in r0:
        assert np.array_equal(r0[name], r1[name]), name
