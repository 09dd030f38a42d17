"""Data-parallel training speed: K processes x T threads, measured through train.py on real batches.

Each configuration is one ``train.py`` run (under ``mpirun -n K`` when K > 1) for ``--steps``
optimizer steps from the same seed on the same corpus, one numformer and BLAS thread count
per process (NUMFORMER_NUM_THREADS / OPENBLAS_NUM_THREADS / OMP_NUM_THREADS). Every
configuration takes the same batches per optimizer step: K processes x ``accum`` =
``--batches-per-step``, so an optimizer step is the same work everywhere and only the
split changes. Reported from rank 0's ``metrics.jsonl``, leaving out the first log window
(warm-up): ms per optimizer step and target tokens per second (non-padding target tokens of
all ranks, the tokens the loss is averaged over). The sentencepiece model is trained once and
copied into every run folder, so runs differ only in how they train.

Also: the cost of one gradient allreduce (``MPI_Allreduce`` of the model's parameter count in
float32, two ranks, median of 20) -- the communication each data-parallel step adds.

    python3 bench/data_parallel.py --corpus bible-en-es --preset small --steps 40
    python3 bench/data_parallel.py --task reverse --preset tiny --steps 60 --configs 1x1,1x2,2x1
    mpirun -n 2 python3 bench/data_parallel.py --allreduce 7600000      # (what the bench runs for the allreduce)
    mpirun -n 2 python3 bench/data_parallel.py --allreduce 52000000 --bucket-elements 4194304   # in buckets
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

if str(ROOT / "bench") not in sys.path:  # bench/worker_process.py, however this file was loaded
    sys.path.insert(0, str(ROOT / "bench"))
from worker_process import run_worker  # noqa: E402  (a worker's failure passed on in its own line)

PROG = "bench/data_parallel.py"  # the name its one-line errors start with


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="bible-en-es")
    ap.add_argument("--task", help="copy or reverse")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--max-tokens", type=positive_int, default=3000, help="tokens per batch (default 3000, small's)")
    ap.add_argument("--batches-per-step", type=positive_int, default=2, help="batches per optimizer step, all ranks together")
    ap.add_argument("--steps", type=positive_int, default=40, help="optimizer steps per run (default 40)")
    ap.add_argument("--log-every", type=positive_int, default=10, help="log window; the first one is warm-up")
    ap.add_argument("--configs", default="1x1,1x2,2x1", help="PROCESSESxTHREADS, comma-separated")
    ap.add_argument("--repeat", type=positive_int, default=1, help="run the configurations this many times, interleaved")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--allreduce", type=positive_int, metavar="N", help=argparse.SUPPRESS)
    ap.add_argument("--bucket-elements", type=positive_int, metavar="K", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # the first log window is warm-up: the figures need a second one after it
    if args.allreduce is None and args.steps < 2 * args.log_every:
        ap.error(f"--steps {args.steps} leaves no log window after the first (warm-up) one of --log-every "
                 f"{args.log_every}: give --steps at least {2 * args.log_every}")
    return args


def mpirun(n: int) -> list[str]:
    exe = shutil.which("mpirun")
    if exe is None:
        raise UsageError("mpirun not found: apt-get install openmpi-bin libopenmpi-dev && pip install mpi4py")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # one core per rank (Open MPI binds to cores by default for 2 ranks); oversubscribe only if asked for more
    return [exe, "-n", str(n), *root, "--oversubscribe"]


def env_for(threads: int) -> dict:
    return dict(os.environ, NUMFORMER_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OMPI_MCA_btl="^openib")


def allreduce_worker(n: int, bucket: int | None = None) -> None:
    """Under mpirun: time ``Allreduce(IN_PLACE, float32[n], SUM)``, in one call or (``bucket``) one call per
    ``bucket`` elements of the same buffer; rank 0 prints the median in ms."""
    import numpy as np

    from numformer.training.distributed import init_world

    world = init_world("cpu")
    buf = np.ones(n, dtype=np.float32)
    pieces = [buf] if bucket is None else [buf[i:i + bucket] for i in range(0, n, bucket)]  # views: in place
    times = []
    for _ in range(23):
        world.comm.Barrier()
        t0 = time.perf_counter()
        for piece in pieces:
            world.allreduce_sum_(piece)
        times.append(time.perf_counter() - t0)
    if world.is_main:
        print(json.dumps({"n": n, "bucket": bucket, "ms": 1000 * sorted(times[3:])[len(times[3:]) // 2]}))


def run_config(procs: int, threads: int, args, vocab: Path, work: Path) -> dict:
    accum = args.batches_per_step // procs
    out = work / f"{procs}x{threads}-{time.monotonic_ns()}"
    out.mkdir()
    shutil.copy(vocab, out / "spm.model")
    data = ["--corpus", args.corpus] if args.corpus else ["--task", args.task]
    cmd = [sys.executable, str(ROOT / "train.py"), *data, "--preset", args.preset, "--max-steps", str(args.steps),
           "--max-tokens", str(args.max_tokens), "--accum", str(accum), "--log-every", str(args.log_every),
           "--eval-every", "0", "--save-every", "0", "--save-every-minutes", "0", "--no-test", "--average-last", "1",
           "--keep-last", "1", "--no-progress", "--out", str(out)]
    if procs > 1:
        cmd = mpirun(procs) + cmd
    t0 = time.perf_counter()
    run_worker(cmd, f"{procs}x{threads} worker (train.py)", env=env_for(threads), cwd=ROOT)
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "tokens_per_s" in r]
    first, last = records[0], records[-1]
    secs = last["elapsed"] - first["elapsed"]
    steps = last["step"] - first["step"]
    tokens = 0.0
    for prev, rec in zip(records, records[1:]):  # tokens of each window after the first
        tokens += rec["tokens_per_s"] * (rec["elapsed"] - prev["elapsed"])
    shutil.rmtree(out, ignore_errors=True)
    return {"config": f"{procs}x{threads}", "processes": procs, "threads": threads, "accum": accum,
            "ms_per_step": 1000 * secs / steps, "target_tokens_per_s": tokens / secs, "counted_steps": steps,
            "wall_s": round(time.perf_counter() - t0, 1)}


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.allreduce:
        allreduce_worker(args.allreduce, args.bucket_elements)
        return 0
    if bool(args.corpus) == bool(args.task):
        raise UsageError("give one of --corpus NAME or --task copy|reverse")
    configs = []
    for item in args.configs.split(","):
        try:
            procs, threads = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise UsageError(f"--configs item {item!r} is not PROCESSESxTHREADS: give e.g. 1x2,2x1") from None
        if procs < 1 or threads < 1:
            raise UsageError(f"--configs item {item!r} has no processes or no threads: give at least 1x1")
        if args.batches_per_step % procs:
            raise UsageError(f"--batches-per-step {args.batches_per_step} cannot be split over {procs} processes: "
                             f"give a --batches-per-step that {procs} divides")
        configs.append((procs, threads))
    from numformer.model import Transformer
    from numformer.data.prepared_dataset import prepare
    from numformer.presets import get_preset

    with tempfile.TemporaryDirectory(prefix="numformer-dp-") as tmp:
        work = Path(tmp)
        data = prepare(work / "vocab", args.corpus, None, args.task, seed=1)
        vocab = work / "vocab" / "spm.model"
        n_params = Transformer(get_preset(args.preset, vocab_size=data.vocab.size)).num_parameters()
        del data
        results = {c: [] for c in configs}
        for _ in range(args.repeat):
            for procs, threads in configs:
                results[(procs, threads)].append(run_config(procs, threads, args, vocab, work))
        ar = None
        if shutil.which("mpirun"):
            proc = subprocess.run(mpirun(2) + [sys.executable, str(Path(__file__).resolve()), "--allreduce",
                                               str(n_params + 2)], capture_output=True, text=True, env=env_for(1))
            ar = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    rows = []
    for (procs, threads), runs in results.items():
        runs.sort(key=lambda r: r["ms_per_step"])
        rows.append(runs[len(runs) // 2])  # the median run
    load = os.getloadavg()
    summary = {"preset": args.preset, "data": args.corpus or args.task, "max_tokens": args.max_tokens,
               "batches_per_step": args.batches_per_step, "steps": args.steps, "parameters": n_params,
               "cpus": os.cpu_count(), "loadavg_after": [round(x, 2) for x in load], "runs": rows,
               "allreduce_ms": ar["ms"] if ar else None}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.preset} on {summary['data']}: {args.batches_per_step} batches of up to {args.max_tokens} tokens "
          f"per optimizer step, {args.steps} steps (first {args.log_every} not counted), {n_params / 1e6:.1f}M "
          f"parameters, {os.cpu_count()} CPUs, load average after {load[0]:.2f}")
    print("| processes x threads | batches per process per step | ms per step | target tokens/s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['processes']} x {r['threads']} | {r['accum']} | {r['ms_per_step']:.0f} | "
              f"{r['target_tokens_per_s']:,.0f} |")
    if ar:
        print(f"gradient allreduce of {n_params + 2:,} float32 between 2 ranks: {ar['ms']:.1f} ms (median of 20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
