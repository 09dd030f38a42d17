"""What each fast kernel buys over the plain function it replaces, one call at a time.

Every kernel of ``numformer.kernels`` and its plain function (``tests/reference/kernel_cases.py``:
``PLAIN``) run on the same real-size inputs (default: the ``small`` preset's training shape, 64
sentences of about 40 tokens, d_model 256, 4 heads, vocabulary 8,000; float32), alternating call
by call; each call gets a fresh copy of its inputs (kernels write in place; the copy is not timed).
Reported: the median milliseconds per call of each, and plain / fast (above 1: the kernel wins).
The whole training step with and without the kernels is ``bench/train_step.py`` under
``NUMFORMER_KERNELS=plain``; this bench says which piece the difference comes from.

    python3 bench/kernel_speed.py
    python3 bench/kernel_speed.py --size base-layer-shape --calls 30 --json
"""
from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the kernel inputs (tests/reference/kernel_cases.py)
from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/kernel_speed.py"  # the name its one-line errors start with

from numformer.kernels.host import tune_host  # noqa: E402

tune_host()  # as train.py does, before numpy is imported

import numpy as np  # noqa: E402

from reference.kernel_cases import PLAIN, SIZES, inputs  # noqa: E402
from numformer import kernels  # noqa: E402
from numformer.backend import RandomState  # noqa: E402
from numformer.kernels.host import threads  # noqa: E402


def fresh(args):
    """An independent copy of a call's arguments (a RandomState gets a twin at the same state)."""
    out = []
    for a in args:
        if isinstance(a, RandomState):
            twin = RandomState(a.seed)
            twin.set_state(a.get_state())
            out.append(twin)
        else:
            out.append(copy.deepcopy(a))
    return tuple(out)


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small-train-shape", choices=list(SIZES))
    ap.add_argument("--calls", type=positive_int, default=20, help="timed calls of each side (default 20)")
    ap.add_argument("--threads", type=positive_int, default=2, help="numformer's host threads (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    threads.set_num_threads(args.threads)
    rows = []
    for name, plain in PLAIN.items():
        fast = kernels.fast_twin(plain)
        call_args = inputs(name, np.random.default_rng(0), args.size, np.float32)
        times = {"fast": [], "plain": []}
        for i in range(args.calls + 2):  # two warm-up calls each
            for side, fn in (("fast", fast), ("plain", plain)):
                a = fresh(call_args)
                t0 = time.perf_counter()
                fn(*a)
                if i >= 2:
                    times[side].append(time.perf_counter() - t0)
        f, p = statistics.median(times["fast"]), statistics.median(times["plain"])
        rows.append({"kernel": name, "fast_ms": round(1e3 * f, 3), "plain_ms": round(1e3 * p, 3),
                     "plain_over_fast": round(p / f, 2)})
    if args.json:
        print(json.dumps({"size": args.size, "threads": args.threads, "calls": args.calls, "rows": rows}, indent=1))
        return 0
    print(f"{args.size}, float32, {args.threads} threads, median of {args.calls} calls")
    print(f"{'kernel':<36} {'fast ms':>9} {'plain ms':>9} {'plain/fast':>11}")
    for r in rows:
        print(f"{r['kernel']:<36} {r['fast_ms']:>9.2f} {r['plain_ms']:>9.2f} {r['plain_over_fast']:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
