#!/usr/bin/env python3
"""How much Python one training step is: the function calls it makes and the numformer modules they cross.

Counts, not times (so it may run on a busy machine): one step of ``Trainer.train_step``'s five lines (forward,
loss, backward, norm, Adam) on a fixed batch, profiled with ``cProfile`` after two warm-up steps. Reported: every
Python-level call, the calls into numformer's own functions, how many of those went to the layer contract's tap
machinery (``numformer/module.py``), and the numformer modules the step's calls cross. On a GPU the host issues
every operation, so these calls are a floor of its step time (docs/gpu.md); on a CPU they are small beside the
arithmetic.

    python3 bench/step_python_calls.py --preset tiny
"""
from __future__ import annotations

import cProfile
import json
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/step_python_calls.py"


def profiled_step(preset: str, batch: int, length: int) -> pstats.Stats:
    """cProfile's statistics of one step of ``preset`` on a (batch, length) random batch, after two warm-up steps."""
    import numpy as np  # noqa: PLC0415

    from numformer.backend import read_scalars  # noqa: PLC0415
    from numformer.loss import LabelSmoothedCrossEntropy  # noqa: PLC0415
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.optim import Adam, clip_grad_norm  # noqa: PLC0415
    from numformer.presets import get_preset  # noqa: PLC0415

    model = Transformer(get_preset(preset, vocab_size=1000), seed=0)
    opt, crit = Adam(model.parameters(), lr=1e-4), LabelSmoothedCrossEntropy(0.1, pad_id=0)
    rng = np.random.default_rng(0)
    src = rng.integers(4, 1000, size=(batch, length))
    tgt = rng.integers(4, 1000, size=(batch, length + 1))

    def step():
        loss = crit.forward(model(src, tgt[:, :-1]), tgt[:, 1:], overwrite_logits=True)
        model.backward(crit.backward())
        read_scalars(np, loss, clip_grad_norm(opt.buffer, 0.0))
        opt.step(zero_grad=True)

    for _ in range(2):
        step()
    profile = cProfile.Profile()
    profile.runcall(step)
    return pstats.Stats(profile)


def counts(stats: pstats.Stats) -> dict:
    """Calls in all, into numformer, into the tap machinery, and the numformer modules crossed."""
    package = str(ROOT / "numformer")
    total = ours = taps = 0
    modules = set()
    for (path, _line, name), (_primitive, calls, *_rest) in stats.stats.items():
        total += calls
        if path.startswith(package):
            ours += calls
            modules.add(str(Path(path).relative_to(ROOT)))
            if path.endswith("module.py") and name in ("run", "_through_taps", "tapped"):
                taps += calls
    return {"python_calls": total, "numformer_calls": ours, "tap_machinery_calls": taps,
            "numformer_modules": len(modules)}


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", choices=("tiny", "small", "base"))
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--length", type=positive_int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = {"preset": args.preset, "batch": args.batch, "length": args.length,
           **counts(profiled_step(args.preset, args.batch, args.length))}
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.preset}, one step of a ({args.batch}, {args.length}) batch: {res['python_calls']:,} Python calls, "
          f"{res['numformer_calls']:,} into numformer ({res['tap_machinery_calls']:,} into the tap machinery), "
          f"across {res['numformer_modules']} numformer modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
