"""What each fast kernel buys: training-step time with every kernel, with each one left out, and plain.

One process, one model, random token batches of the preset's benchmark shape (as
``bench/train_step.py``: float32, dropout 0.1, label smoothing 0.1, Adam). The
configurations alternate step by step in rounds (all kernels, then each kernel left out
in turn with ``numformer.kernels.set_disabled``, then the plain math), so drift of the
machine's speed hits them alike; the median step time of each is reported, and its
ratio to all kernels on. The process-wide tunings (glibc allocator, OpenBLAS spin) are
set once at start and stay on here; ``NUMFORMER_KERNELS=plain python3 bench/train_step.py``
measures the plain math without them.

    python3 bench/kernel_ablation.py --preset small --rounds 6
    python3 bench/kernel_ablation.py --preset base --rounds 3 --json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from numformer.kernels.blas_threads import tune_blas_threads  # noqa: E402

tune_blas_threads()  # as train.py does, before numpy is imported

import numpy as np  # noqa: E402

from numformer import kernels  # noqa: E402
from numformer.loss import LabelSmoothedCrossEntropy  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.optim import Adam  # noqa: E402
from numformer.presets import get_preset  # noqa: E402

SHAPES = {  # vocabulary, batch, length: bench/train_step.py's shapes
    "tiny": (4000, 64, 32), "small": (8000, 64, 40), "base": (16000, 32, 40),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=5, help="steps timed per configuration")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    vocab, batch, length = SHAPES[args.preset]
    cfg = get_preset(args.preset, vocab_size=vocab)
    model = Transformer(cfg, seed=0)
    model.train()
    crit = LabelSmoothedCrossEntropy(cfg.label_smoothing, cfg.pad_id)
    opt = Adam(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    src = rng.integers(4, vocab, (batch, length))
    tgt = rng.integers(4, vocab, (batch, length + 1))

    def step():
        t = time.perf_counter()
        logits = model(src, tgt[:, :-1])
        crit.forward(logits, tgt[:, 1:], overwrite_logits=True)
        model.backward(crit.backward())
        opt.step(zero_grad=True)
        return time.perf_counter() - t

    configs = [("all kernels", "fast", ())] + [(f"without {k}", "fast", (k,)) for k in kernels.kernel_names()]
    configs.append(("plain math", "plain", ()))
    times = {name: [] for name, _, _ in configs}
    for name, mode, off in configs:  # warm-up: one step each
        kernels.use_kernels(mode)
        kernels.set_disabled(off)
        step()
    for r in range(args.rounds):
        for name, mode, off in configs:
            kernels.use_kernels(mode)
            kernels.set_disabled(off)
            times[name].append(step())
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    base = statistics.median(times["all kernels"])
    rows = [{"config": name, "median_ms": round(1000 * statistics.median(t), 1),
             "vs_all_kernels": round(statistics.median(t) / base, 3)} for name, t in times.items()]
    if args.json:
        print(json.dumps({"preset": args.preset, "shape": [batch, length, vocab], "rounds": args.rounds,
                          "threads": os.environ.get("NUMFORMER_NUM_THREADS", "all"), "rows": rows}))
        return 0
    print(f"{args.preset}: batch {batch} x {length}, vocabulary {vocab}, {args.rounds} rounds")
    print(f"{'configuration':<22} {'ms/step':>9} {'vs all kernels':>15}")
    for row in rows:
        print(f"{row['config']:<22} {row['median_ms']:>9.1f} {row['vs_all_kernels']:>14.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
