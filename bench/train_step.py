"""Time full training steps (forward, backward, Adam) of numformer against PyTorch.

PyTorch columns (``tests/reference/torch_reference.py``, same architecture and recipe):

* ``pytorch``: plain eager code: separate Q/K/V maps, a written-out softmax, default Adam;
* ``best eager``: Q/K/V fused into one in-projection (as ``nn.MultiheadAttention``),
  ``F.scaled_dot_product_attention`` with the boolean masks, ``Adam(fused=True)`` (``foreach``
  where the fused kernel is missing);
* ``compiled``: the best-eager model under ``torch.compile`` (``--no-compile`` skips it); the
  compile time (the first step's extra time over the median) is reported apart. When compiling
  fails on this machine the column says why (the exception's first line) instead of timing.

Both sides run with the same glibc allocator tuning (numformer's, ``numformer/kernels/host/allocator.py``: large
temporaries reused instead of re-mapped each step); without it PyTorch's step is 15-20% slower on this machine,
and until 2026-11-27 this bench compared so (``--torch-malloc default`` still does).

Random token batches of fixed length (no padding), float32, post-LN, tied
embeddings, dropout 0.1, label smoothing 0.1. Each side runs in its own child
process (so peak RSS is per process), pinned to the same thread count
(OMP/OPENBLAS/MKL_NUM_THREADS in the environment, ``torch.set_num_threads``).
Warm-up steps are not counted; the median of the counted steps is reported, with the
median process CPU time per step (all threads): with ``--threads 1`` on a loaded machine
that is the fairer comparison of work, since wall time then depends on the other load.

Also reported: matmul FLOPs per step (forward GEMMs x 3 for forward + backward)
and the share of this machine's float32 GEMM peak (MFU), the peak being measured
with a big numpy matmul under the same thread count.

    python bench/train_step.py --preset small
    python bench/train_step.py --preset tiny,small,base --repeat 3
    python bench/train_step.py --d-model 256 --heads 4 --layers 3 --d-ff 1024 --vocab 8000 \\
        --batch 64 --src-len 40 --tgt-len 40 --steps 20 --json

With ``--repeat R`` the two sides alternate R times and the median of the
per-run medians is reported (robust against other load on the machine).

``--corpus NAME`` (or ``--data DIR``) times real batches instead: the first ``--batches`` batches (default 40) of the corpus's
first epoch, as train.py deals them (its vocabulary, ``EpochWalk``'s token buckets of ``--max-tokens``,
padding included), each counted once, both sides on the same batches. Then the figures are means over those
batches (``mean_step_ms``, target tokens/s from the real target tokens) and the ratios are ratios of the total
times: a fixed-length random batch has no padding and one length, which real batches do not.

    python bench/train_step.py --preset small --corpus bible-en-es --no-compile
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, seed_int, nonneg_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

if str(ROOT / "bench") not in sys.path:  # bench/worker_process.py, however this file was loaded
    sys.path.insert(0, str(ROOT / "bench"))
from worker_process import run_worker  # noqa: E402  (a worker's failure passed on in its own line)

PROG = "bench/train_step.py"  # the name its one-line errors start with

PRESETS = {
    "tiny": dict(d_model=128, heads=4, layers=2, d_ff=512, vocab=4000, batch=64, src_len=32, tgt_len=32),
    "small": dict(d_model=256, heads=4, layers=3, d_ff=1024, vocab=8000, batch=64, src_len=40, tgt_len=40),
    "base": dict(d_model=512, heads=8, layers=6, d_ff=2048, vocab=16000, batch=32, src_len=40, tgt_len=40),
}
SHAPE_KEYS = ("d_model", "heads", "layers", "d_ff", "vocab", "batch", "src_len", "tgt_len")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=None, help="tiny, small, base, or a comma-separated list (or 'all')")
    for key, default in PRESETS["small"].items():
        ap.add_argument("--" + key.replace("_", "-"), type=positive_int, default=None, help=f"default {default} (small)")
    ap.add_argument("--steps", type=positive_int, default=20, help="counted steps (default 20)")
    ap.add_argument("--warmup", type=nonneg_int, default=3, help="uncounted warm-up steps (default 3)")
    ap.add_argument("--repeat", type=positive_int, default=1, help="alternate numformer/PyTorch runs this many times")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    ap.add_argument("--threads", type=positive_int, default=2, help="threads for BLAS/OpenMP and torch (default 2)")
    ap.add_argument("--seed", type=seed_int, default=0)
    ap.add_argument("--compare", dest="compare", action="store_true", default=True,
                    help="also run the PyTorch reference (default)")
    ap.add_argument("--no-torch", dest="compare", action="store_false", help="skip the PyTorch side")
    ap.add_argument("--no-best", dest="best", action="store_false", help="skip the best-eager PyTorch column")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile column")
    ap.add_argument("--compile-repeat", type=positive_int, default=1,
                    help="runs of the compiled column per preset (default 1: each run compiles anew)")
    ap.add_argument("--corpus", help="time real batches of this corpus (bible-en-es, messages-en-es, ...)")
    ap.add_argument("--data", help="time real batches of the corpus in this folder ({train,valid,test}.{src,tgt})")
    ap.add_argument("--batches", type=positive_int, default=40, help="with --corpus: batches timed (default 40)")
    ap.add_argument("--max-tokens", type=positive_int, default=None,
                    help="with --corpus: tokens per batch (default: the preset's CPU recipe, small 3000)")
    ap.add_argument("--torch-malloc", choices=("tuned", "default"), default="tuned",
                    help="PyTorch's processes get numformer's glibc allocator tuning (tuned, the default: PyTorch at its "
                         "best, as a user who sets MALLOC_MMAP_THRESHOLD_ or preloads jemalloc has it) or glibc's "
                         "defaults (default: how this bench compared before 2026-11-27)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", choices=["numformer", "torch", "torch-best", "torch-compile", "peak"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--batches-file", help=argparse.SUPPRESS)  # the parent's real batches, for the workers
    args = ap.parse_args(argv)
    if args.corpus and args.data:
        ap.error("--corpus and --data both name a corpus: give one")
    args.real = bool(args.corpus or args.data)
    return args


def configs(args):
    names = [None] if args.preset is None else (
        list(PRESETS) if args.preset == "all" else [n.strip() for n in args.preset.split(",")])
    out = []
    for name in names:
        if name is not None and name not in PRESETS:
            raise UsageError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)} (or all)")
        shape = dict(PRESETS[name or "small"])
        for key in SHAPE_KEYS:
            value = getattr(args, key)
            if value is not None:
                shape[key] = value
        shape["name"] = name or "custom"
        out.append(shape)
    return out


def matmul_flops(s) -> int:
    """Matmul FLOPs of one training step: forward GEMMs x 3 (forward, input grad, weight grad)."""
    b, S, T, d, f, v, n = s["batch"], s["src_len"], s["tgt_len"], s["d_model"], s["d_ff"], s["vocab"], s["layers"]
    enc = 4 * 2 * b * S * d * d + 2 * 2 * b * S * S * d + 2 * 2 * b * S * d * f
    dec = (4 * 2 * b * T * d * d + 2 * 2 * b * T * T * d                          # self-attention
           + 2 * 2 * b * T * d * d + 2 * 2 * b * S * d * d + 2 * 2 * b * T * S * d  # encoder-decoder attention
           + 2 * 2 * b * T * d * f)
    out = 2 * b * T * d * v
    return 3 * (n * (enc + dec) + out)


def peak_rss_mb() -> float:
    import resource  # noqa: PLC0415

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def summarize(times, s, cpu_times=None, tgt_tokens=None):
    """Per-step figures. Random batches: medians (every step is the same work). Real batches (``tgt_tokens``,
    the target tokens of each timed step): means, so that a ratio of two sides is a ratio of total times."""
    med = statistics.median(times)
    extra = {"median_cpu_ms": statistics.median(cpu_times) * 1e3} if cpu_times else {}
    if tgt_tokens:
        extra.update(mean_step_ms=statistics.fmean(times) * 1e3, mean_cpu_ms=statistics.fmean(cpu_times) * 1e3)
    return {**extra, "median_step_ms": med * 1e3, "min_step_ms": min(times) * 1e3,
            "tokens_per_s": sum(tgt_tokens) / sum(times) if tgt_tokens else s["batch"] * s["tgt_len"] / med,
            "peak_rss_mb": peak_rss_mb(), "steps": len(times)}


def real_batches(args, s) -> tuple[str, dict]:
    """The corpus's first ``--batches`` training batches as train.py deals them, saved for the workers:
    -> (the .npz file, the shape with the corpus's vocabulary and longest lengths)."""
    import tempfile  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from numformer.data.prepared_dataset import prepare  # noqa: PLC0415
    from numformer.training.config import RECIPES  # noqa: PLC0415
    from numformer.training.epochs import EpochWalk  # noqa: PLC0415

    folder = Path(tempfile.mkdtemp(prefix="numformer-train-step-"))
    data = prepare(folder / "run", corpus=args.corpus, data_dir=args.data, log=lambda *a: None)
    max_tokens = args.max_tokens or RECIPES.get(s["name"], RECIPES["small"])["max_tokens"]
    batches, _ = EpochWalk(data, max_tokens, args.seed, 256, 1024, log=lambda *a: None).next_batches(args.batches)
    arrays = {f"{k}{i}": getattr(b, k) for i, b in enumerate(batches) for k in ("src", "tgt_in", "tgt_out")}
    np.savez(folder / "batches.npz", **arrays)
    shape = dict(s, vocab=data.vocab.size, src_len=max(b.src.shape[1] for b in batches),
                 tgt_len=max(b.tgt_in.shape[1] for b in batches), batch=max(b.src.shape[0] for b in batches),
                 corpus=args.corpus or args.data, batches=len(batches), max_tokens=max_tokens,
                 tgt_tokens=sum(b.n_tgt_tokens for b in batches),
                 tokens_with_padding=sum(b.src.size + b.tgt_in.size for b in batches))
    # the matmul work of a mean step, each batch at its own shape (MFU is then mean work over mean time)
    shape["flops_per_step"] = statistics.fmean(matmul_flops(dict(s, batch=b.src.shape[0], src_len=b.src.shape[1],
                                                                 tgt_len=b.tgt_in.shape[1])) for b in batches)
    return str(folder / "batches.npz"), shape


def load_batches(args, s, to_device):
    """The batches a worker times: the parent's real ones, else 4 random fixed-length ones.
    -> (list of (src, tgt_in, tgt_out) on the device, the target tokens of each or None)."""
    import numpy as np  # noqa: PLC0415

    if args.batches_file:
        with np.load(args.batches_file) as f:
            n = len(f.files) // 3
            host = [tuple(f[f"{k}{i}"] for k in ("src", "tgt_in", "tgt_out")) for i in range(n)]
        return [tuple(to_device(a) for a in b) for b in host], [int((b[2] != 0).sum()) for b in host]
    rng = np.random.default_rng(args.seed)
    return [tuple(to_device(rng.integers(1, s["vocab"], (s["batch"], n))) for n in (s["src_len"], s["tgt_len"],
                                                                                      s["tgt_len"]))
            for _ in range(4)], None


def benched_model(s, xp, seed: int = 0):
    """The model, Adam and loss every training-step bench times (this one, gpu_train_step.py, step_breakdown.py):
    shape ``s``, float32, post-LN, tied embeddings, dropout 0.1, label smoothing 0.1, in training mode on ``xp``.
    -> (model, optimizer, loss)."""
    import numpy as np  # noqa: PLC0415

    from numformer.loss import LabelSmoothedCrossEntropy  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.optim import Adam  # noqa: PLC0415
    from numformer.presets import ModelConfig  # noqa: PLC0415

    cfg = ModelConfig(vocab_size=s["vocab"], d_model=s["d_model"], d_ff=s["d_ff"], heads=s["heads"],
                      layers=s["layers"], dropout=0.1, label_smoothing=0.1, max_len=max(s["src_len"], s["tgt_len"]) + 1)
    model = Transformer(cfg, seed=seed, dtype=np.float32)
    if xp is not np:
        model.to(xp)
    model.train()
    return model, Adam(model.parameters(), lr=1e-4), LabelSmoothedCrossEntropy(0.1, pad_id=0)


def timed_steps(args, batches):
    """The order of the steps: warm-up first, then each batch once (real batches) or ``--steps`` steps."""
    count = len(batches) if args.batches_file else args.steps
    return [(i % len(batches), i >= args.warmup) for i in range(args.warmup + count)]


def counted_tokens(order, tgt_tokens):
    """The target tokens of each counted step of ``order`` (``timed_steps``'s), or None for random batches."""
    return [tgt_tokens[j] for j, counts in order if counts] if tgt_tokens else None


# -- workers (run in child processes) ------------------------------------------------
def worker_peak(args):
    import numpy as np  # noqa: PLC0415

    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return {"gemm_peak_gflops": 2 * n ** 3 / min(times) / 1e9, "gemm_n": n}


def worker_numformer(args, s):
    sys.path.insert(0, str(ROOT))
    from numformer.kernels.host import tune_host  # noqa: PLC0415

    tune_host()  # as train.py does, before numpy is imported
    from numformer.backend import describe, to_xp, xp_for  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    xp = xp_for(args.device)
    model, opt, crit = benched_model(s, xp, args.seed)
    batches, tgt_tokens = load_batches(args, s, lambda a: to_xp(a, xp))
    sync = (lambda: xp.cuda.Stream.null.synchronize()) if xp is not np else (lambda: None)
    import inspect  # noqa: PLC0415

    # The logits are not needed after the loss: let the loss reuse their buffer where it can.
    loss_kw = {"overwrite_logits": True} if "overwrite_logits" in inspect.signature(crit.forward).parameters else {}
    times, cpu, order = [], [], timed_steps(args, batches)
    for j, counts in order:
        src, tgt_in, tgt_out = batches[j]
        c0, t0 = time.process_time(), time.perf_counter()
        logits = model(src, tgt_in)
        loss = crit.forward(logits, tgt_out, **loss_kw)
        del logits
        model.backward(crit.backward())
        opt.step(zero_grad=True)  # as the Trainer does: gradients zeroed inside the update's pass
        sync()
        if counts:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    out = summarize(times, s, cpu, counted_tokens(order, tgt_tokens))
    out.update(final_loss=float(loss), backend=describe(xp))
    return out


def worker_torch(args, s, variant="plain", compiled=False):
    sys.path.insert(0, str(ROOT / "tests"))  # the reference models (tests/reference/)
    if args.torch_malloc == "tuned":  # the allocator numformer's side runs with (numformer/kernels/host/allocator.py)
        from numformer.kernels.host.allocator import tune_allocator  # noqa: PLC0415

        tune_allocator()
    import torch  # noqa: PLC0415

    from reference.torch_reference import make  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if args.device.startswith("cuda") else "cpu")
    model, opt, loss_fn = make(s["vocab"], s["d_model"], s["heads"], s["layers"], s["d_ff"], seed=args.seed,
                               variant=variant, device=dev)
    step_model = torch.compile(model) if compiled else model
    batches, tgt_tokens = load_batches(args, s, lambda a: torch.from_numpy(a).long().to(dev))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times, cpu, order = [], [], timed_steps(args, batches)
    for i, (j, counts) in enumerate(order):
        src, tgt_in, tgt_out = batches[j]
        c0, t0 = time.process_time(), time.perf_counter()
        loss = loss_fn(step_model(src, tgt_in), tgt_out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i == 0:
            first = time.perf_counter() - t0
        if counts:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    out = summarize(times, s, cpu, counted_tokens(order, tgt_tokens))
    adam = "fused" if opt.defaults.get("fused") else "foreach" if opt.defaults.get("foreach") else "default"
    out.update(final_loss=float(loss), backend=f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
               f"{variant} attention, {adam} Adam, glibc malloc {args.torch_malloc}" + (", torch.compile" if compiled else ""))
    if compiled:  # the first step compiles forward and backward: its time over a steady step
        out["compile_s"] = first - statistics.median(times)
    return out


def worker_torch_compile(args, s):
    """The best-eager model under torch.compile; where compiling fails, the reason instead of times."""
    try:
        return worker_torch(args, s, "best", compiled=True)
    except Exception as exc:  # noqa: BLE001  (any compiler failure is reported, not raised)
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return {"error": f"{type(exc).__name__}: {line[:300]}"}


# -- parent -------------------------------------------------------------------------
def run_child(args, kind, shape=None):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = str(args.threads)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--threads", str(args.threads),
           "--torch-malloc", args.torch_malloc,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device,
           "--seed", str(args.seed)]
    if shape is not None:
        cmd += ["--shape", json.dumps(shape)]
    if getattr(args, "batches_file", None):
        cmd += ["--batches-file", args.batches_file]
    proc = run_worker(cmd, f"{kind} worker", env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(runs):
    out = dict(runs[0])
    for key in ("median_step_ms", "min_step_ms", "tokens_per_s", "peak_rss_mb", "median_cpu_ms", "mean_step_ms",
                "mean_cpu_ms"):
        if key in out:
            out[key] = statistics.median(r[key] for r in runs)
    out["runs_median_step_ms"] = [round(r["median_step_ms"], 1) for r in runs]
    return out


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        if args.worker == "peak":
            result = worker_peak(args)
        else:
            s = json.loads(args.shape)
            result = {"numformer": lambda: worker_numformer(args, s), "torch": lambda: worker_torch(args, s),
                      "torch-best": lambda: worker_torch(args, s, "best"),
                      "torch-compile": lambda: worker_torch_compile(args, s)}[args.worker]()
        print(json.dumps(result))
        return
    peak = run_child(args, "peak")["gemm_peak_gflops"] if args.device == "cpu" else None
    results = []
    if args.real:
        args.compile = False  # batches of many shapes: torch.compile would time its recompilations
    for s in configs(args):
        if args.real:
            args.batches_file, s = real_batches(args, s)
        step = "mean_step_ms" if args.real else "median_step_ms"  # real batches: ratios of total times
        cpu_key = "mean_cpu_ms" if args.real else "median_cpu_ms"
        flops = s.get("flops_per_step") or matmul_flops(s)
        nf_runs, pt_runs, best_runs, compiled_runs = [], [], [], []
        for _ in range(max(args.repeat, 1)):
            nf_runs.append(run_child(args, "numformer", s))
            if args.compare:
                pt_runs.append(run_child(args, "torch", s))
                if args.best:
                    best_runs.append(run_child(args, "torch-best", s))
                if (args.compile and len(compiled_runs) < args.compile_repeat
                        and not any("error" in r for r in compiled_runs)):
                    compiled_runs.append(run_child(args, "torch-compile", s))
        nf = median_of(nf_runs)
        keys = ("median_step_ms", "median_cpu_ms", "min_step_ms", "tokens_per_s", "peak_rss_mb", "runs_median_step_ms",
                "backend") + (("mean_step_ms", "mean_cpu_ms") if args.real else ())
        real = {k: s[k] for k in ("corpus", "batches", "max_tokens", "tgt_tokens", "tokens_with_padding")
                if k in s}
        r = {"config": s["name"], "shape": {k: s[k] for k in SHAPE_KEYS}, **({"real_batches": real} if real else {}),
             "threads": args.threads, "device": args.device, **{k: nf[k] for k in keys},
             "matmul_gflop_per_step": flops / 1e9, "gemm_peak_gflops": peak,
             "mfu": (flops / (nf["median_step_ms"] / 1e3) / (peak * 1e9)) if peak else None}
        if args.compare:
            pt = median_of(pt_runs)
            r["torch"] = {k: pt[k] for k in keys}
            r["torch"]["mfu"] = (flops / (pt["median_step_ms"] / 1e3) / (peak * 1e9)) if peak else None
            r["ratio_step_time"] = nf[step] / pt[step]
            r["ratio_cpu_time"] = nf[cpu_key] / pt[cpu_key]
            r["ratio_peak_rss"] = nf["peak_rss_mb"] / pt["peak_rss_mb"]
            for key, runs in (("torch_best", best_runs), ("torch_compiled", compiled_runs)):
                if not runs:
                    continue
                if any("error" in x for x in runs):
                    r[key] = {"error": next(x["error"] for x in runs if "error" in x)}
                    continue
                col = median_of(runs)
                r[key] = {k: col[k] for k in keys}
                r[key]["mfu"] = (flops / (col["median_step_ms"] / 1e3) / (peak * 1e9)) if peak else None
                if "compile_s" in col:
                    r[key]["compile_s"] = statistics.median(x["compile_s"] for x in runs)
                r[f"ratio_step_time_{key.split('_')[1]}"] = nf[step] / col[step]
        results.append(r)
        if not args.json:
            report(r)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else {"results": results}, indent=None))


def report(r):
    sh = r["shape"]
    print(f"[{r['config']}] d={sh['d_model']} h={sh['heads']} N={sh['layers']} d_ff={sh['d_ff']} V={sh['vocab']} "
          f"batch={sh['batch']} S={sh['src_len']} T={sh['tgt_len']}  threads={r['threads']}  "
          f"{r['matmul_gflop_per_step']:.2f} GFLOP/step (matmul), GEMM peak "
          f"{r['gemm_peak_gflops'] or float('nan'):.0f} GFLOP/s")
    rows = [("numformer", r)] + ([("pytorch", r["torch"])] if "torch" in r else [])
    rows += [(name, r[key]) for name, key in (("best eager", "torch_best"), ("compiled", "torch_compiled"))
             if key in r and "error" not in r[key]]
    if "real_batches" in r:
        rb = r["real_batches"]
        print(f"  real batches: the first {rb['batches']} of {rb['corpus']} at --max-tokens {rb['max_tokens']} "
              f"({rb['tgt_tokens']} target tokens; shapes above are the largest); means over the batches")
    for name, x in rows:
        mfu = x.get("mfu")
        print(f"  {name:10s} {x.get('mean_step_ms', x['median_step_ms']):8.1f} ms/step (min {x['min_step_ms']:.1f})  "
              f"(CPU {x.get('mean_cpu_ms', x['median_cpu_ms']):.0f} ms)  {x['tokens_per_s']:8.0f} tgt tok/s  peak RSS {x['peak_rss_mb']:7.1f} MB  "
              f"MFU {100 * mfu if mfu else float('nan'):5.1f}%  runs {x['runs_median_step_ms']}"
              + (f"  (compile {x['compile_s']:.1f} s, not counted)" if "compile_s" in x else ""))
    if "torch_compiled" in r and "error" in r["torch_compiled"]:
        print(f"  compiled   did not run here: {r['torch_compiled']['error']}")
    if "torch" in r:
        print(f"  ratio numformer/pytorch: step time {r['ratio_step_time']:.2f}x (process CPU time "
              f"{r['ratio_cpu_time']:.2f}x), peak RSS {r['ratio_peak_rss']:.2f}x")
        for name, key in (("best eager", "best"), ("compiled", "compiled")):
            if f"ratio_step_time_{key}" in r:
                print(f"  ratio numformer/{name}: step time {r[f'ratio_step_time_{key}']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
