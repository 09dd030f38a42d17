#!/usr/bin/env python3
"""Where a numformer training step's time goes, per layer type: the base step of bench/gpu_train_step.py, timed
layer by layer with the device synchronised around every call.

Every layer gets a forward and a backward tap (``numformer.module.tapped``, the layers' public contract) that
synchronises the device, reads the clock, runs the layer and synchronises again. A layer's exclusive time is
its time less that of the layers it calls, so the rows add up to the tapped step. The loss, the gradient norm
with the step's one read-back, and Adam are timed the same way. The synchronisations cost time of their own,
so the tapped step is longer than the plain one (both are printed); the shares are what the breakdown is for.

    python3 bench/step_breakdown.py --device cuda                  # base, 25,000 target tokens, float32
    python3 bench/step_breakdown.py --device cuda --precision tf32
    python3 bench/step_breakdown.py --device cpu --quick           # tiny shapes (the dry run)
    python3 bench/step_breakdown.py --device cpu --shape small --corpus bible-en-es   # real batches on the CPU
"""
from __future__ import annotations

import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from numformer.cli.arguments import OneLineParser, nonneg_int, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from gpu_train_step import SHAPES  # noqa: E402  (the same shapes as the GPU step's benchmark)
from train_step import PRESETS, benched_model, load_batches, real_batches  # noqa: E402  (the CPU bench's pieces)

#: --shape: the GPU bench's base batch of 25,000 target tokens, its dry-run shapes, and the CPU bench's presets
BREAKDOWN_SHAPES = {"gpu-base": SHAPES["base"], "quick": SHAPES["quick"], **PRESETS}

PROG = "bench/step_breakdown.py"


class LayerClock:
    """Exclusive device time per (layer type, forward/backward), the device synchronised around each call."""

    def __init__(self, sync):
        self.sync = sync
        self.total = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.inner = [0.0]  # time of the calls made inside the call now running, per nesting level

    def timed(self, key, run, *args, **kwargs):
        self.sync()
        self.inner.append(0.0)
        t0 = time.perf_counter()
        out = run(*args, **kwargs)
        self.sync()
        took = time.perf_counter() - t0
        inside = self.inner.pop()
        self.total[key] += took - inside
        self.calls[key] += 1
        self.inner[-1] += took
        return out

    def tap(self, kind):
        return lambda module, run, *a, **k: self.timed((type(module).__name__, kind), run, *a, **k)


def breakdown(args) -> dict:
    import numpy as np  # noqa: PLC0415

    from numformer.backend import read_scalars, to_xp, xp_for  # noqa: PLC0415
    from numformer.module import tapped  # noqa: PLC0415
    from numformer.kernels import kernel  # noqa: PLC0415
    from numformer.optim import grad_norm  # noqa: PLC0415
    from numformer.precision import set_matmul_precision  # noqa: PLC0415

    s = dict(BREAKDOWN_SHAPES["quick" if args.quick else args.shape], name=args.shape)
    if args.corpus or args.data:  # the corpus's first batches as train.py deals them, each timed once a pass
        args.batches_file, s = real_batches(args, s)
    set_matmul_precision(args.precision, args.device)
    xp = xp_for(args.device)
    on_gpu = xp is not np
    sync = (lambda: xp.cuda.Stream.null.synchronize()) if on_gpu else (lambda: None)
    model, opt, crit = benched_model(s, xp)
    batches, tgt_tokens = load_batches(args, s, lambda a: to_xp(a, xp))
    if not args.batches_file:
        batches, tgt_tokens = batches[:1], None  # one random batch, the same every step
    steps = len(batches) if args.batches_file else args.steps

    def step(batch, clock=None):
        src, tgt_in, tgt_out = batch

        def timed(key, run, *a):
            return clock.timed(key, run, *a) if clock else run(*a)
        logits = model(src, tgt_in)
        loss = timed(("loss", "forward"), lambda: crit.forward(logits, tgt_out, overwrite_logits=True))
        dlogits = timed(("loss", "backward"), crit.backward)
        model.backward(dlogits)
        # the norm as the trainer takes it (clip_grad_norm): the fused kernel's where the switch runs it
        timed(("gradient norm and read-back", "step"), lambda: read_scalars(xp, loss, kernel(grad_norm)(opt.buffer)))
        timed(("Adam", "step"), lambda: opt.step(zero_grad=True))

    plain = []
    for i in range(args.warmup + steps):
        sync()
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        sync()
        if i >= args.warmup:
            plain.append(time.perf_counter() - t0)
    clock = LayerClock(sync)
    tapped_times = []
    with tapped(list(model.modules()), forward=clock.tap("forward"), backward=clock.tap("backward")):
        for i in range(steps):
            sync()
            t0 = time.perf_counter()
            step(batches[i % len(batches)], clock)
            sync()
            tapped_times.append(time.perf_counter() - t0)
    total = sum(clock.total.values())
    rows = sorted(({"layer": k[0], "pass": k[1], "ms_per_step": round(v / steps * 1e3, 2),
                    "calls_per_step": clock.calls[k] // steps, "share": round(v / total, 4)}
                   for k, v in clock.total.items()), key=lambda r: -r["ms_per_step"])
    # a mean per step, as the rows are (real batches: each batch once a pass)
    return {"device": args.device, "precision": args.precision, "shape": s, "steps": steps,
            "target_tokens_per_step": (sum(tgt_tokens) / steps if tgt_tokens else s["batch"] * s["tgt_len"]),
            "plain_step_ms": round(sum(plain) / steps * 1e3, 2),
            "tapped_step_ms": round(sum(tapped_times) / steps * 1e3, 2),
            "timed_ms": round(total / steps * 1e3, 2), "rows": rows}


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"))
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the dry run)")
    ap.add_argument("--shape", default="gpu-base", choices=sorted(BREAKDOWN_SHAPES),
                    help="gpu-base (default: 625 x 40, bench/gpu_train_step.py's), or bench/train_step.py's presets")
    ap.add_argument("--corpus", help="real batches of this corpus (as bench/train_step.py --corpus)")
    ap.add_argument("--data", help="real batches of the corpus in this folder")
    ap.add_argument("--batches", type=positive_int, default=20, help="with --corpus or --data: batches timed (default 20)")
    ap.add_argument("--max-tokens", type=positive_int, default=None, help="with --corpus or --data: tokens per batch")
    ap.add_argument("--steps", type=positive_int, default=3, help="timed steps, plain and tapped (default 3)")
    ap.add_argument("--warmup", type=nonneg_int, default=2, help="untimed steps first (default 2)")
    ap.add_argument("--json", action="store_true")
    # what bench/train_step.py's real_batches and load_batches read: no batches file yet, and train.py's seed
    ap.set_defaults(batches_file=None, seed=0)
    args = ap.parse_args(argv)
    res = breakdown(args)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.device} {args.precision}, {res['steps']} steps of {res['target_tokens_per_step']:.0f} target tokens "
          f"on average: plain step {res['plain_step_ms']} ms, tapped {res['tapped_step_ms']} ms "
          f"(layers and steps timed: {res['timed_ms']} ms)")
    for r in res["rows"]:
        print(f"  {r['layer']:28s} {r['pass']:8s} {r['ms_per_step']:9.2f} ms  {r['calls_per_step']:4d} calls  "
              f"{100 * r['share']:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
