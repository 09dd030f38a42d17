"""What per-sentence gradient statistics cost: a training step with them on against off.

Both sides run numformer's training step (forward, loss, backward, Adam) on the same random token batches
(the shapes of ``bench/train_step.py``'s presets; fixed length, post-LN, tied embeddings, dropout 0.1,
label smoothing 0.1), each side in its own child process so that peak RSS is per side:

* ``off``: the plain step;
* ``norms``: the layers tapped for the squared norm of every sentence's gradient of every tensor
  (numformer/training/per_sentence_gradients.py, ``elementwise=False``) and the noise scale computed from them
  (numformer/training/gradient_noise_scale.py) on every step: what ``train.py --log-grads 1`` does;
* ``elementwise``: the full statistics (the per-element sums of squares and the sum as well), for the
  studies that want the per-element variance.

Reported: median ms per step of the counted steps, peak RSS, and each side's ratios to ``off``. The
issue's goal: at most 1.5x the step time and at most +10% peak memory on the small preset.

    python bench/per_sentence_cost.py                    # small preset
    python bench/per_sentence_cost.py --preset tiny,small --repeat 3 --json

With ``--repeat R`` the sides alternate R times; the median of the per-run medians is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, nonneg_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402

PROG = "bench/per_sentence_cost.py"  # the name its one-line errors start with
sys.path.insert(0, str(ROOT / "bench"))

from train_step import PRESETS  # noqa: E402  (the same shapes as the step benchmark)
from worker_process import side_result  # noqa: E402  (a side in a child; a failure passed on in its own line)

SIDES = ("off", "norms", "elementwise")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", help="tiny, small, base, or a comma-separated list")
    ap.add_argument("--steps", type=positive_int, default=10, help="counted steps (default 10)")
    ap.add_argument("--warmup", type=nonneg_int, default=2, help="uncounted warm-up steps (default 2)")
    ap.add_argument("--repeat", type=positive_int, default=1, help="alternate the sides this many times (default 1)")
    ap.add_argument("--threads", type=positive_int, default=os.cpu_count(), help="BLAS threads (default: every core)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def worker(args) -> dict:
    from numformer.kernels.host import tune_host  # noqa: PLC0415

    tune_host()
    import numpy as np  # noqa: PLC0415

    from numformer.loss import LabelSmoothedCrossEntropy  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.optim import Adam  # noqa: PLC0415
    from numformer.presets import ModelConfig  # noqa: PLC0415
    from numformer.training.gradient_noise_scale import noise_scales  # noqa: PLC0415
    from numformer.training.per_sentence_gradients import PerSentenceGradients  # noqa: PLC0415

    s = json.loads(args.shape)
    cfg = ModelConfig(vocab_size=s["vocab"], d_model=s["d_model"], d_ff=s["d_ff"], heads=s["heads"],
                      layers=s["layers"], dropout=0.1, label_smoothing=0.1, max_len=max(s["src_len"], s["tgt_len"]) + 1)
    model = Transformer(cfg, seed=0, dtype=np.float32)
    opt = Adam(model.parameters(), lr=1e-4)
    crit = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    rng = np.random.default_rng(0)
    batches = [tuple(rng.integers(1, s["vocab"], (s["batch"], n)) for n in (s["src_len"], s["tgt_len"], s["tgt_len"]))
               for _ in range(4)]
    times, scale = [], None
    for i in range(args.warmup + args.steps):
        src, tgt_in, tgt_out = batches[i % len(batches)]
        t0 = time.perf_counter()
        tap = None if args.worker == "off" else PerSentenceGradients(model, elementwise=args.worker == "elementwise")
        if tap is not None:
            tap.__enter__()
        logits = model(src, tgt_in)
        crit.forward(logits, tgt_out, overwrite_logits=True)
        del logits
        model.backward(crit.backward())
        if tap is not None:
            tap.__exit__(None, None, None)
            scale = noise_scales(tap.statistics())["total"].b_simple
        opt.step(zero_grad=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {"median_step_ms": 1e3 * statistics.median(times),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "b_simple": scale}


def run_child(args, side, shape) -> dict:
    return side_result(Path(__file__).resolve(), side, shape, args, ROOT)


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(worker(args)))
        return 0
    results = {}
    for name in args.preset.split(","):
        if name not in PRESETS:
            raise UsageError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)}")
        shape = PRESETS[name]
        runs = {side: [] for side in SIDES}
        for _ in range(args.repeat):
            for side in SIDES:
                runs[side].append(run_child(args, side, shape))
        med = {side: {k: statistics.median(r[k] for r in rs) for k in ("median_step_ms", "peak_rss_mb")}
               for side, rs in runs.items()}
        results[name] = {"shape": shape, **med,
                         "ratios": {side: {"step_time": med[side]["median_step_ms"] / med["off"]["median_step_ms"],
                                           "peak_rss": med[side]["peak_rss_mb"] / med["off"]["peak_rss_mb"]}
                                    for side in SIDES[1:]},
                         "runs_step_ms": {side: [round(r["median_step_ms"], 1) for r in rs] for side, rs in runs.items()}}
    if args.json:
        print(json.dumps(results))
    else:
        for name, r in results.items():
            print(f"{name}: off {r['off']['median_step_ms']:.0f} ms/step, {r['off']['peak_rss_mb']:.0f} MB")
            for side in SIDES[1:]:
                print(f"  {side:<11} {r[side]['median_step_ms']:.0f} ms/step, {r[side]['peak_rss_mb']:.0f} MB: step time "
                      f"x{r['ratios'][side]['step_time']:.2f}, peak memory x{r['ratios'][side]['peak_rss']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
