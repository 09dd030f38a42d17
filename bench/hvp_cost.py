"""What an exact Hessian-vector product costs: forward over reverse against two gradient evaluations (the
differences it replaces) and against PyTorch's double backward, in time and memory.

Every side computes ``H v`` of the label-smoothed loss (Section 5.4) with respect to *every* parameter on the
same random token batch (the shapes of ``bench/train_step.py``'s presets; post-LN, tied embeddings, dropout 0,
float32), each in its own child process so that peak RSS is per side:

* ``gradients``: two of numformer's gradient evaluations (forward, loss, backward), what one product by central
  differences costs (numformer/curvature/hvp.py, ``method="differences"``);
* ``exact``: one exact product, forward over reverse: forward, ``jvp``, the loss's, ``backward_jvp``
  (``BlockHessian(method="exact")``, numformer/forward_mode.py);
* ``torch``: PyTorch's double backward on the same model written as a PyTorch user would for speed
  (tests/reference/torch_reference.py with ``F.scaled_dot_product_attention``, math kernel: the fused CPU
  attention has no double backward), ``grad(loss, params, create_graph=True)`` then ``grad(grads, params,
  grad_outputs=v)``: what PyHessian does.

Reported: median ms per product of the counted ones, peak RSS, and the ratios to ``gradients``.

    python bench/hvp_cost.py                              # tiny, small, base
    python bench/hvp_cost.py --preset small --steps 5 --repeat 3 --json

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

PROG = "bench/hvp_cost.py"  # the name its one-line errors start with
sys.path.insert(0, str(ROOT / "bench"))

from train_step import PRESETS  # noqa: E402  (the same shapes as the step benchmark)
from worker_process import side_result  # noqa: E402  (a side in a child; a failure passed on in its own line)

SIDES = ("gradients", "exact", "torch")


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny,small,base", help="tiny, small, base, or a comma-separated list")
    ap.add_argument("--steps", type=positive_int, default=5, help="counted products (default 5)")
    ap.add_argument("--warmup", type=nonneg_int, default=1, help="uncounted warm-up products (default 1)")
    ap.add_argument("--repeat", type=positive_int, default=1, help="alternate the sides this many times (default 1)")
    ap.add_argument("--threads", type=positive_int, default=os.cpu_count(), help="BLAS threads (default: every core)")
    ap.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch side")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _config(s):
    from numformer.presets import ModelConfig  # noqa: PLC0415
    return ModelConfig(vocab_size=s["vocab"], d_model=s["d_model"], d_ff=s["d_ff"], heads=s["heads"],
                       layers=s["layers"], dropout=0.0, label_smoothing=0.1,
                       max_len=max(s["src_len"], s["tgt_len"]) + 1)


def _batch(s):
    import numpy as np  # noqa: PLC0415
    rng = np.random.default_rng(0)
    return tuple(rng.integers(1, s["vocab"], (s["batch"], n)) for n in (s["src_len"], s["tgt_len"], s["tgt_len"]))


def worker_numformer(args, s) -> list:
    from numformer.kernels.host import tune_host  # noqa: PLC0415

    tune_host()
    import numpy as np  # noqa: PLC0415

    from numformer.curvature.hvp import BlockHessian  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415

    model = Transformer(_config(s), seed=0, dtype=np.float32)
    names = [n for n, _ in model.named_parameters()]
    exact = args.worker == "exact"
    hessian = BlockHessian(model, _batch(s), names, method="exact" if exact else "differences", allow_float32=True)
    v = np.random.default_rng(1).standard_normal(hessian.dim).astype(np.float32)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        if exact:
            hessian(v)
        else:  # the two gradients of a central difference (the weights moved and restored as the method does)
            h = hessian.step(v)
            hessian.gradient(h * v), hessian.gradient(-h * v)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times


def worker_torch(args, s) -> list:
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "tests"))
    from torch_trainer import label_smoothed_sum, load_into_torch, torch_model_for  # noqa: PLC0415

    from numformer.model import Transformer  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    cfg = _config(s)
    module = torch_model_for(cfg)
    load_into_torch(module, cfg, Transformer(cfg, seed=0, dtype=np.float32).state_dict())
    module.train()
    params = list(module.parameters())
    src, tgt_in, tgt_out = (torch.as_tensor(a) for a in _batch(s))
    rng = np.random.default_rng(1)
    v = [torch.as_tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32)) for p in params]
    n_tokens = int((tgt_out != cfg.pad_id).sum())
    times = []
    with sdpa_kernel(SDPBackend.MATH):  # the kernel with a double backward on the CPU
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss = label_smoothed_sum(module(src, tgt_in), tgt_out, cfg.label_smoothing, cfg.pad_id)[0] / n_tokens
            grads = torch.autograd.grad(loss, params, create_graph=True)
            torch.autograd.grad(grads, params, grad_outputs=v)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    return times


def run_child(args, side, shape) -> dict:
    return side_result(Path(__file__).resolve(), side, shape, args, ROOT)


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        shape = json.loads(args.shape)
        times = worker_torch(args, shape) if args.worker == "torch" else worker_numformer(args, shape)
        print(json.dumps({"median_ms": 1e3 * statistics.median(times),
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))
        return 0
    sides = SIDES if args.torch else SIDES[:2]
    results = {}
    for name in args.preset.split(","):
        if name not in PRESETS:
            raise UsageError(f"unknown preset {name!r}: choose from {', '.join(PRESETS)}")
        shape = PRESETS[name]
        runs = {side: [] for side in sides}
        for _ in range(args.repeat):
            for side in sides:
                runs[side].append(run_child(args, side, shape))
        med = {side: {k: statistics.median(r[k] for r in rs) for k in ("median_ms", "peak_rss_mb")}
               for side, rs in runs.items()}
        results[name] = {"shape": shape, **med,
                         "ratios": {side: {"time": med[side]["median_ms"] / med["gradients"]["median_ms"],
                                           "peak_rss": med[side]["peak_rss_mb"] / med["gradients"]["peak_rss_mb"]}
                                    for side in sides[1:]},
                         "runs_ms": {side: [round(r["median_ms"], 1) for r in rs] for side, rs in runs.items()}}
    if args.json:
        print(json.dumps(results))
    else:
        for name, r in results.items():
            print(f"{name}: two gradients {r['gradients']['median_ms']:.0f} ms, {r['gradients']['peak_rss_mb']:.0f} MB")
            for side in sides[1:]:
                print(f"  {side:<9} {r[side]['median_ms']:.0f} ms, {r[side]['peak_rss_mb']:.0f} MB: time "
                      f"x{r['ratios'][side]['time']:.2f}, peak memory x{r['ratios'][side]['peak_rss']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
