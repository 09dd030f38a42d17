"""Data scaling: preparation time, peak memory and time to the first step for corpora of N sentence pairs.

For each N a synthetic parallel corpus (bench/synthetic_corpus.py: made-up Zipfian words, WMT-like
sentence lengths, from ``--seed``; written to a temporary folder and deleted, never committed) is

1. prepared by ``python -m numformer.prepare`` in its own process: wall time and that process's peak
   resident memory (``ru_maxrss`` from ``wait4``; the bench itself stays small, since a child's
   figure starts from the RSS of the process it was forked from);
2. trained on by ``train.py --preset tiny --max-steps 3`` in another process, from the prepared
   dataset: peak resident memory, and the time from the process's start to its first step's line in
   ``metrics.jsonl`` (imports, opening the map, planning epoch 0, gathering and computing step 1).

A baseline run (20,000 pairs, same vocabulary size) gives what the model and the program need
whatever the corpus; "beyond" is a run's peak minus the baseline's: what the corpus costs.

    python3 bench/data_scale.py                          # N = 0.5M, 1.5M, 4.5M
    python3 bench/data_scale.py --pairs 500000 --json
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
from numformer.cli.arguments import OneLineParser, seed_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

if str(ROOT / "bench") not in sys.path:  # bench/worker_process.py, however this file was loaded
    sys.path.insert(0, str(ROOT / "bench"))
from worker_process import WorkerFailed, run_worker  # noqa: E402  (a worker's failure passed on in its own line)

PROG = "bench/data_scale.py"  # the name its one-line errors start with

BASELINE_PAIRS = 20_000


def run_measured(cmd, what: str, watch: Path | None = None, timeout: float = 3600) -> dict:
    """Run ``cmd``; its wall time, peak RSS (MB) and, with ``watch``, seconds until that file has a line.
    When it fails: :class:`WorkerFailed` (``what``, its last line of output, its exit status)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    out_lines = []
    # Polling a file while the child's pipe fills would block it: the output goes to a thread.
    import threading  # noqa: PLC0415

    reader = threading.Thread(target=lambda: out_lines.extend(proc.stdout), daemon=True)
    reader.start()
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if watch is not None and first is None and watch.exists() and watch.stat().st_size > 0:
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            proc.kill()
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    reader.join(5)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        # stderr is merged into the output: its last line is the child's own error line
        raise WorkerFailed(what, proc.returncode, "".join(out_lines))
    return {"seconds": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "first_step_s": None if first is None else round(first, 1), "log": "".join(out_lines)}


def measure(n: int, work: Path, args) -> dict:
    corpus, run = work / f"corpus-{n}", work / f"run-{n}"
    # The corpus is written by another process: this one stays small (no numpy), because a child's
    # ru_maxrss starts from the RSS of the process it was forked from.
    t0 = time.perf_counter()
    run_worker([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from synthetic_corpus import "
                    "write_corpus; write_corpus(sys.argv[2], int(sys.argv[3]), seed=int(sys.argv[4]))",
                    str(ROOT / "bench"), str(corpus), str(n), str(args.seed)], "corpus writer")
    made = time.perf_counter() - t0
    size_mb = sum(f.stat().st_size for f in corpus.iterdir()) / 2 ** 20
    common = ["--data", str(corpus), "--out", str(run), "--vocab-size", str(args.vocab_size)]
    prep = run_measured([sys.executable, "-m", "numformer.prepare", *common, "--seed", "1"]
                        + (["--threads", str(args.threads)] if args.threads else []), "prepare worker")
    train = run_measured([sys.executable, "train.py", *common, "--preset", args.preset, "--max-steps", str(args.steps),
                          "--log-every", "1", "--eval-every", "0", "--no-test", "--no-progress", "--average-last", "1",
                          "--save-every", "0"], "train.py worker", watch=run / "metrics.jsonl")
    manifest = json.loads((run / "prepared" / "manifest.json").read_text())
    shutil.rmtree(corpus)
    shutil.rmtree(run)
    return {"pairs": n, "text_mb": round(size_mb), "tokens": sum(manifest["tokens"].values()),
            "vocab": manifest["vocab"]["size"], "generate_s": round(made, 1),
            "prepare_s": prep["seconds"], "prepare_peak_rss_mb": prep["peak_rss_mb"], "prepare_log": prep["log"],
            "train_peak_rss_mb": train["peak_rss_mb"], "first_step_s": train["first_step_s"]}


def corpus_sizes(text: str) -> list[int]:
    """``--pairs``: comma-separated sizes (``500000`` or ``5e5``), each at least one pair."""
    sizes = []
    for item in text.split(","):
        try:
            size = int(float(item))
        except (ValueError, OverflowError):  # not a number, or nan or inf
            raise argparse.ArgumentTypeError(f"expected sizes separated by commas, got {item!r} in {text!r}") from None
        if size < 1:
            raise argparse.ArgumentTypeError(f"a corpus of {item} pairs has nothing to train on: give sizes of at least 1")
        if size not in positive_int:
            raise argparse.ArgumentTypeError(f"sizes must be {positive_int.words()}, got {item}")
        sizes.append(size)
    return sizes


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=corpus_sizes, default=[500000, 1500000, 4500000],
                    help="comma-separated corpus sizes (default 500000,1500000,4500000)")
    ap.add_argument("--vocab-size", type=positive_int, default=8000, help="the same for every size (and the baseline)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=positive_int, default=3)
    ap.add_argument("--seed", type=seed_int, default=0, help="of the synthetic corpus")
    ap.add_argument("--threads", type=positive_int, help="sentencepiece threads (default: every core)")
    ap.add_argument("--work", help="folder for the corpora (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sizes = args.pairs
    with tempfile.TemporaryDirectory(prefix="numformer-scale-", dir=args.work) as tmp:
        base = measure(BASELINE_PAIRS, Path(tmp), args)
        rows = []
        for n in sizes:
            row = measure(n, Path(tmp), args)
            row["train_rss_beyond_baseline_mb"] = round(row["train_peak_rss_mb"] - base["train_peak_rss_mb"], 1)
            rows.append(row)
            if not args.json:
                print(f"{n:,} pairs: prepared in {row['prepare_s']} s; {row['prepare_log'].strip()}", flush=True)
    load = os.getloadavg()
    summary = {"baseline": {k: v for k, v in base.items() if k != "prepare_log"},
               "runs": [{k: v for k, v in r.items() if k != "prepare_log"} for r in rows],
               "preset": args.preset, "steps": args.steps, "cpus": os.cpu_count(),
               "loadavg_after": [round(x, 2) for x in load]}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"preset {args.preset}, vocabulary {args.vocab_size}, {os.cpu_count()} CPUs, load average after "
          f"{load[0]:.2f}; baseline ({BASELINE_PAIRS:,} pairs): training peak RSS {base['train_peak_rss_mb']:.0f} MB, "
          f"first step {base['first_step_s']} s")
    print("| training pairs | text | tokens | prepare | peak RSS, preparing | peak RSS, training (beyond baseline) "
          "| first step after start |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pairs']:,} | {r['text_mb']:,} MB | {r['tokens'] / 1e6:.0f}M | {r['prepare_s']:.0f} s | "
              f"{r['prepare_peak_rss_mb']:,.0f} MB | {r['train_peak_rss_mb']:,.0f} MB "
              f"(+{r['train_rss_beyond_baseline_mb']:,.0f} MB) | {r['first_step_s']} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
