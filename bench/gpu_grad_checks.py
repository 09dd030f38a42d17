"""The gradient checks of ``grad_checks`` run on a device: float64 directional central differences there.

``python -m grad_checks`` checks on the host (numformer/finite_differences/ reads gradients with
numpy). This runner takes the same cases (``grad_checks.cases.build_cases``), moves each
case's module and float inputs to the array module of ``--device`` (cupy for cuda), and
checks every parameter and input tensor there in float64 along random +-1 directions u
(Chainer's ``check_backward`` idea): ``<grad, u>`` against ``(L(x + h u) - L(x - h u)) / 2h``
with ``L = sum_i <out_i, G_i>`` and random upstream gradients G. Dropout cases replay
their mask on the device (the case's ``before_forward`` reseeds the device generator).
A direction whose two evaluations see different ReLU active sets straddles a kink and is
redrawn. Error: ``|a - n| / max(|a| + |n|, 1e-3 * largest gradient entry of the case)``,
as ``numformer/finite_differences/`` measures it.

    python bench/gpu_grad_checks.py --device cuda --json
    python bench/gpu_grad_checks.py --device cpu --layer LayerNorm   # the same runner on numpy
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from numformer.cli.arguments import OneLineParser, seed_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

PROG = "bench/gpu_grad_checks.py"  # the name its one-line errors start with

import numpy as np  # noqa: E402


def _signature(module, to_host):
    """The pieces every layer declaring kinks (Module.kinks, the layer contract) was on in the last forward."""
    parts = [to_host(m.active_set).tobytes() for m in module.modules()
             if getattr(m, "kinks", None) is True and m.active_set is not None]
    return hash(b"".join(parts))


def check_case(case, xp, rng, h=1e-5, directions=3, tolerance=1e-6):
    """-> list of (tensor name, worst relative error, probes) for one case on array module ``xp``."""
    from numformer.backend import to_host  # noqa: PLC0415
    from numformer.layers import Dropout  # noqa: PLC0415

    module = case.module
    module.to(xp)
    for m in module.modules():  # stand-alone dropout generators (not a model's) move with their layer
        if isinstance(m, Dropout) and m.rng is not None:
            m.rng.to(xp)
    inputs = {k: xp.asarray(v) for k, v in case.inputs.items()}
    case.inputs = inputs
    module.train()

    def outputs():
        if case.before_forward is not None:
            case.before_forward()
        out = case.forward(module, inputs)
        return out if isinstance(out, tuple) else (out,)

    outs = outputs()
    upstream = [xp.asarray(rng.standard_normal(o.shape)) for o in outs]
    module.zero_grad()
    input_grads = case.backward(module, upstream)
    params = case.params if case.params is not None else dict(module.named_parameters())
    tensors = [(n, p.data, p.grad.copy()) for n, p in params.items()]
    tensors += [(f"input:{n}", inputs[n], g.copy()) for n, g in input_grads.items()]
    gmax = max([float(to_host(abs(g).max())) for _, _, g in tensors if g.size] + [0.0])
    tiny = max(1e-3 * gmax, 1e-8)

    def objective():
        total = sum(float(to_host((o * g).sum())) for o, g in zip(outputs(), upstream))
        sig = _signature(module, to_host)
        module.clear_cache()
        return total, sig

    results = []
    for name, x, grad in tensors:
        worst, probes, tries = 0.0, 0, 0
        while probes < directions and tries < 4 * directions:
            tries += 1
            u = xp.asarray(rng.choice([-1.0, 1.0], size=x.shape))
            old = x.copy()
            x[...] = old + h * u
            lp, sp = objective()
            x[...] = old - h * u
            lm, sm = objective()
            x[...] = old
            if sp != sm:
                continue  # straddles a declared kink: draw another direction
            a = float(to_host((grad * u).sum()))
            n = (lp - lm) / (2 * h)
            worst = max(worst, abs(a - n) / max(abs(a) + abs(n), tiny))
            probes += 1
        results.append({"layer": case.layer, "case": case.case, "tensor": name, "probes": probes,
                        "max_rel_error": worst, "passed": bool(worst <= tolerance and probes > 0)})
    module.zero_grad()
    return results


def run(device: str = "cuda", layers=None, seed: int = 0, tolerance: float = 1e-6) -> dict:
    from grad_checks.cases import named_cases, probe_seed  # noqa: PLC0415
    from numformer.backend import xp_for  # noqa: PLC0415

    xp = xp_for(device)
    start = time.perf_counter()
    results = []
    for builder, case in named_cases(layers, seed=seed):  # each case's probes seeded by its name, as on the host
        results += check_case(case, xp, np.random.default_rng(probe_seed(builder, case, seed)), tolerance=tolerance)
    failed = [r for r in results if not r["passed"]]
    return {"device": device, "dtype": "float64", "checks": len(results), "failed": len(failed),
            "max_rel_error": max((r["max_rel_error"] for r in results), default=0.0), "tolerance": tolerance,
            "layers": sorted({r["layer"] for r in results}), "seconds": round(time.perf_counter() - start, 2),
            "failures": failed[:20]}


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layer", action="append", help="only this layer (repeatable; default all)")
    ap.add_argument("--seed", type=seed_int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    summary = run(args.device, args.layer, args.seed)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['checks']} tensors on {summary['device']} (float64), {summary['failed']} failed, worst "
              f"relative error {summary['max_rel_error']:.2e} (tolerance {summary['tolerance']:g}), "
              f"{summary['seconds']} s")
        for r in summary["failures"]:
            print(f"  FAIL {r['layer']} / {r['case']} / {r['tensor']}: {r['max_rel_error']:.2e}")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
