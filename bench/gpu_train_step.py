"""One training step of numformer on a GPU (cupy) against PyTorch eager, per matmul precision.

Both sides: random token batches of a fixed length (no padding), post-LN, tied embeddings,
dropout 0.1, label smoothing 0.1, Adam; the same shapes, the same device, the same
precision, each side in its own child process (so one side's memory pool does not
count against the other). Precisions (``--precision fp32,tf32,fp16``):

* fp32: numformer's default; PyTorch with ``allow_tf32`` off.
* tf32: numformer ``--precision tf32`` (cuBLAS TF32 compute type); PyTorch with
  ``torch.backends.cuda.matmul.allow_tf32 = True``.
* fp16: numformer ``--precision fp16`` (fp16 GEMM operands, float32 master weights, dynamic
  loss scaling); PyTorch ``torch.autocast(dtype=float16)`` with ``GradScaler``.

numformer's step is the trainer's (``numformer.training.trainer.Trainer.step`` without the data
loader): forward, loss with ``overwrite_logits``, backward (scaled in fp16, the weights' float16 copies made
once), unscale, the global gradient norm read back with the loss in one transfer, ``Adam.step(zero_grad=True)``.
With ``--graphs`` a child of its own then times the step as ``train.py --cuda-graphs`` runs it
(:mod:`numformer.training.step_graphs`: captured once, replayed), reported as the row's ``numformer_graphs``
(with the graphs' pool bytes). Each child's figures are printed the moment it ends (``--json``: one line of
everything so far after each child), so a child that crashes, or a time box that ends, loses none measured before.
The fused CUDA kernels run where ``numformer/kernels/cuda_proofs.json`` proves them or
``NUMFORMER_CUDA_UNPROVEN=1`` is set (the acceptance run sets it once its kernel tests passed).
Reported per side: median ms/step of the counted steps (device synchronised before each
clock read), target tokens/s, peak device memory (numformer: cupy's memory pool total,
which only grows; PyTorch: ``max_memory_reserved``; on the CPU: peak RSS).

    python bench/gpu_train_step.py --device cuda                       # base, ~25k target tokens, 3 precisions
    python bench/gpu_train_step.py --device cpu --quick --json         # tiny shapes (the acceptance dry run)

Imports ``tests/reference/torch_reference.py`` for the PyTorch model.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, nonneg_int, positive_float, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/gpu_train_step.py"  # the name its one-line errors start with

SHAPES = {
    # base (Table 3) with a batch of 625 x 40 = 25,000 target tokens (and as many source tokens)
    "base": dict(d_model=512, heads=8, layers=6, d_ff=2048, vocab=16000, batch=625, src_len=40, tgt_len=40),
    "quick": dict(d_model=32, heads=2, layers=1, d_ff=64, vocab=100, batch=4, src_len=8, tgt_len=8),
}


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default=None, help="comma-separated: fp32,tf32,fp16 (default all; cpu: fp32,fp16)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2 counted steps (the dry run)")
    ap.add_argument("--steps", type=positive_int, default=None, help="counted steps (default 10; --quick 2)")
    ap.add_argument("--warmup", type=nonneg_int, default=None, help="uncounted steps first (default 3; --quick 1)")
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch side")
    ap.add_argument("--graphs", action="store_true", help="numformer also as CUDA graphs (train.py --cuda-graphs)")
    ap.add_argument("--timeout", type=positive_float, default=240, help="seconds per child process")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", choices=["numformer", "graphs", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.steps = args.steps or (2 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    return args


def _peak_rss_mb() -> float:
    import resource  # noqa: PLC0415

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _result(times, s, peak_mb, loss, backend):
    med = statistics.median(times)
    return {"median_step_ms": round(med * 1e3, 2), "min_step_ms": round(min(times) * 1e3, 2),
            "target_tokens_per_s": round(s["batch"] * s["tgt_len"] / med, 1), "peak_memory_mb": round(peak_mb, 1),
            "final_loss": loss, "backend": backend, "steps": len(times)}


def _setup(args, s):
    """numformer's side of a child: the precision set, the benched model, Adam, loss, scaler, two device batches and
    the device's sync. -> (xp, model, opt, crit, scaler, batches, sync)."""
    sys.path.insert(0, str(ROOT))
    import numpy as np  # noqa: PLC0415

    from numformer.backend import to_xp, xp_for  # noqa: PLC0415
    from numformer.precision import set_matmul_precision  # noqa: PLC0415
    from numformer.training.loss_scaling import DynamicLossScaler  # noqa: PLC0415
    from train_step import benched_model  # noqa: PLC0415  (bench/ is on the path: this script's folder)

    set_matmul_precision(args.mode, args.device)  # before the model moves: TF32 is read at the first GEMM
    xp = xp_for(args.device)
    model, opt, crit = benched_model(s, xp)
    scaler = DynamicLossScaler() if args.mode == "fp16" else None
    rng = np.random.default_rng(0)
    batches = [tuple(to_xp(rng.integers(1, s["vocab"], (s["batch"], n)), xp) for n in (s["src_len"], s["tgt_len"],
                                                                                        s["tgt_len"]))
               for _ in range(2)]
    on_gpu = xp is not np
    sync = (lambda: xp.cuda.get_current_stream().synchronize()) if on_gpu else (lambda: None)
    return xp, model, opt, crit, scaler, batches, sync


def worker_numformer(args, s):
    """The eager step with the fused kernels, as Trainer.train_step runs it."""
    import numpy as np  # noqa: PLC0415

    xp, model, opt, crit, scaler, batches, sync = _setup(args, s)
    from numformer.backend import describe, read_scalars  # noqa: PLC0415
    from numformer.precision import half_weights  # noqa: PLC0415

    on_gpu = xp is not np
    times, host, loss_host = [], [], float("nan")
    for i in range(args.warmup + args.steps):
        src, tgt_in, tgt_out = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        with half_weights(opt.buffer):
            loss, gnorm_device = _eager_passes(model, crit, opt, scaler, src, tgt_in, tgt_out)
        enqueued = time.perf_counter()  # the host has issued forward and backward; the GPU may still be at work
        loss_host, gnorm = read_scalars(xp, loss, gnorm_device)  # the trainer's one sync per step
        if scaler is not None and scaler.update(found_nonfinite=not np.isfinite(gnorm)):
            opt.zero_grad()
        else:
            opt.step(zero_grad=True)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            host.append(enqueued - t0)
    peak = xp.get_default_memory_pool().total_bytes() / 2 ** 20 if on_gpu else _peak_rss_mb()
    # host time to issue forward and backward: near the step's whole time, the step waits on Python and kernel
    # launches, not on the GPU's arithmetic
    return {**_result(times, s, peak, loss_host, describe(xp) + f", precision {args.mode}"),
            "host_issue_ms": round(statistics.median(host) * 1e3, 2)}


def worker_graphs(args, s):
    """The step as ``train.py --cuda-graphs`` runs it, in a child of its own (a crash here loses no eager figure)."""
    xp, model, opt, crit, scaler, batches, sync = _setup(args, s)
    return graph_steps(args, s, xp, model, opt, crit, scaler, [_host_batch(b) for b in batches], sync)


def _eager_passes(model, crit, opt, scaler, src, tgt_in, tgt_out):
    """Forward, loss, backward (scaled in fp16) and unscale: (loss, gradient norm), on the device."""
    from numformer.kernels import kernel  # noqa: PLC0415
    from numformer.optim import grad_norm  # noqa: PLC0415

    logits = model(src, tgt_in)
    loss = crit.forward(logits, tgt_out, overwrite_logits=True)
    del logits
    dlogits = crit.backward()
    model.backward(dlogits if scaler is None else scaler.scale_grad_(dlogits))
    if scaler is not None:
        scaler.unscale_(opt.buffer)
    return loss, kernel(grad_norm)(opt.buffer)


class _HostBatch:
    """A bench batch as the trainer's batches are: host arrays, and its target token count."""

    def __init__(self, src, tgt_in, tgt_out):
        self.src, self.tgt_in, self.tgt_out = src, tgt_in, tgt_out
        self.n_tgt_tokens = int((tgt_out != 0).sum())


def _host_batch(batch):
    from numformer.backend import to_host  # noqa: PLC0415

    return _HostBatch(*(to_host(a) for a in batch))


def graph_steps(args, s, xp, model, opt, crit, scaler, batches, sync) -> dict:
    """The step as ``train.py --cuda-graphs`` runs it, timed like the eager one: the shape's first step runs
    uncaptured, the second is captured, the counted ones replay. ``host_issue_ms``: until the replay is issued."""
    from types import SimpleNamespace  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from numformer.training.config import TrainConfig  # noqa: PLC0415
    from numformer.training.distributed import SINGLE  # noqa: PLC0415
    from numformer.training.step_graphs import StepGraphs  # noqa: PLC0415
    from numformer.training.step_hooks import LossScaling, StepHooks  # noqa: PLC0415

    said = []
    trainer = SimpleNamespace(  # what StepGraphs reads of a Trainer
        xp=xp, model=model, criterion=crit, optimizer=opt, cfg=TrainConfig(), scaler=scaler, world=SINGLE,
        hooks=StepHooks(LossScaling(scaler, opt.buffer) if scaler is not None else None), grad_stats=None,
        batch_seeded=False, my_share=lambda batches: list(range(len(batches))), log=said.append)
    on_gpu = xp is not np
    # the CPU dry run rehearses the captured body (no capture) with the CUDA kernels on the host emulator
    trainer.step_graphs = graphs = StepGraphs(trainer, rehearse=not on_gpu)
    with contextlib.nullcontext() if on_gpu else _emulated():
        return _timed_graph_steps(args, s, xp, batches, sync, graphs, said)


def _emulated():
    from numformer.kernels.cuda_emulator import emulated  # noqa: PLC0415  (a test tool: the CPU dry run only)

    return emulated()


def _timed_graph_steps(args, s, xp, batches, sync, graphs, said) -> dict:
    import numpy as np  # noqa: PLC0415

    times, host, loss_host = [], [], float("nan")
    warmup = max(args.warmup, 2)  # the uncaptured first sighting and the capture are not counted
    for i in range(warmup + args.steps):
        b = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        out = graphs.step([b], b.n_tgt_tokens)
        if out is None:
            return {"status": "uncaptured", "why": [str(line) for line in said]}
        enqueued = time.perf_counter()
        loss_host = graphs.judge(out, b.n_tgt_tokens).loss  # the trainer's host half: its one sync, its verdict
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            host.append(enqueued - t0)
    on_gpu = xp is not np
    peak = xp.get_default_memory_pool().total_bytes() / 2 ** 20 if on_gpu else _peak_rss_mb()
    return {"status": "ok", **_result(times, s, peak, loss_host, "CUDA graphs" if on_gpu else "rehearsed (CPU)"),
            "host_issue_ms": round(statistics.median(host) * 1e3, 2),
            "graph_memory_mb": round(graphs.memory_bytes() / 2 ** 20, 1), "graphs": len(graphs.steps)}


def worker_torch(args, s):
    sys.path.insert(0, str(ROOT / "tests"))  # the reference models (tests/reference/)
    import torch  # noqa: PLC0415

    from reference.torch_reference import make  # noqa: PLC0415

    dev = torch.device("cuda" if args.device.startswith("cuda") else "cpu")
    on_gpu = dev.type == "cuda"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = args.mode == "tf32"
        torch.backends.cudnn.allow_tf32 = args.mode == "tf32"
    model, opt, loss_fn = make(s["vocab"], s["d_model"], s["heads"], s["layers"], s["d_ff"], seed=0)
    model.to(dev)
    amp = args.mode == "fp16"
    scaler = torch.amp.GradScaler(dev.type, enabled=amp)
    g = torch.Generator().manual_seed(0)
    batches = [tuple(torch.randint(1, s["vocab"], (s["batch"], n), generator=g).to(dev)
                     for n in (s["src_len"], s["tgt_len"], s["tgt_len"])) for _ in range(2)]
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    times, loss = [], None
    for i in range(args.warmup + args.steps):
        src, tgt_in, tgt_out = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.float16 if on_gpu else torch.bfloat16, enabled=amp):
            loss = loss_fn(model(src, tgt_in), tgt_out)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_reserved() / 2 ** 20 if on_gpu else _peak_rss_mb()
    backend = f"torch {torch.__version__} on {torch.cuda.get_device_name() if on_gpu else 'cpu'}, precision {args.mode}"
    if amp and not on_gpu:
        backend += " (CPU autocast is bfloat16)"
    return _result(times, s, peak, float(loss), backend)


def run_child(args, kind, mode):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--mode", mode, "--device", args.device,
           "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": args.timeout}
    if proc.returncode != 0:
        return {"status": "failed", "error": proc.stderr.strip().splitlines()[-1:] or ["?"],
                "stderr_tail": proc.stderr[-2000:]}
    return {"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}  # a worker's own status wins


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    shape = SHAPES["quick" if args.quick else "base"]
    if args.worker:
        worker = {"numformer": worker_numformer, "graphs": worker_graphs, "torch": worker_torch}[args.worker]
        print(json.dumps(worker(args, shape)))
        return 0
    on_cpu = args.device == "cpu"
    modes = args.precision.split(",") if args.precision else (["fp32", "fp16"] if on_cpu else ["fp32", "tf32", "fp16"])
    rows = []
    summary = {"device": args.device, "shape": shape, "target_tokens_per_step": shape["batch"] * shape["tgt_len"],
               "steps": args.steps, "warmup": args.warmup, "rows": rows}

    def report():
        """Each child's figures the moment it ends: one JSON line of everything so far (--json; the acceptance run
        keeps the last one, so a child that crashes or a box that ends loses no figure already measured)."""
        if args.json:
            print(json.dumps(summary), flush=True)

    for mode in modes:
        row = {"precision": mode}
        rows.append(row)
        # 1. numformer eager with the fused kernels, 2. the same step captured, 3. PyTorch eager: each its own child
        row["numformer"] = {"status": "not on cpu"} if on_cpu and mode == "tf32" else run_child(args, "numformer", mode)
        report()
        if args.graphs and not (on_cpu and mode == "tf32"):
            row["numformer_graphs"] = run_child(args, "graphs", mode)
            report()
        row["torch"] = run_child(args, "torch", mode) if args.torch else {"status": "skipped"}
        nf, pt, graphs = row["numformer"], row["torch"], row.get("numformer_graphs") or {}
        if nf.get("status") == "ok" and pt.get("status") == "ok":
            row["ratio_step_time"] = round(nf["median_step_ms"] / pt["median_step_ms"], 3)
            row["ratio_peak_memory"] = round(nf["peak_memory_mb"] / pt["peak_memory_mb"], 3)
        if graphs.get("status") == "ok":
            row["graphs_host_issue_share"] = round(graphs["host_issue_ms"] / graphs["median_step_ms"], 3)
            if pt.get("status") == "ok":
                row["ratio_step_time_graphs"] = round(graphs["median_step_ms"] / pt["median_step_ms"], 3)
        report()
        if not args.json:
            for side in ("numformer", "torch"):
                r = row[side]
                if r.get("status") == "ok":
                    print(f"{mode:5s} {side:9s} {r['median_step_ms']:9.1f} ms/step  {r['target_tokens_per_s']:10.0f} "
                          f"tgt tok/s  peak {r['peak_memory_mb']:8.0f} MB  {r['backend']}")
                else:
                    print(f"{mode:5s} {side:9s} {r.get('status')}: {r.get('error', '')}")
            g = row.get("numformer_graphs")
            if g and g.get("status") == "ok":
                print(f"{mode:5s} {'graphs':9s} {g['median_step_ms']:9.1f} ms/step  "
                      f"host issue {g['host_issue_ms']:.1f} ms, graph memory {g['graph_memory_mb']:.0f} MB")
            elif g:
                print(f"{mode:5s} {'graphs':9s} {g.get('status')}: {g.get('why') or g.get('error')}")
            if "ratio_step_time" in row:
                print(f"{mode:5s} ratio numformer/PyTorch: step time {row['ratio_step_time']:.2f}x, "
                      f"peak memory {row['ratio_peak_memory']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
