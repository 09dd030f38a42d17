"""Command line: ``python -m grad_checks [--layer NAME] [--json] [--verbose] [--checkpoint RUN]``.

Prints a table (layer, case, tensor, probes, worst relative error, pass/fail) and
exits 1 if any tensor fails; ``--json`` prints one JSON object instead.

Both modes of differentiation are checked (``--mode``): reverse mode, every backward against central
differences of the forward (the tensors by name); forward mode, every layer's JVP against central differences
of its forward (rows ``jvp along ...``) and the tangent of its backward, Pearlmutter's R-operator, against
central differences of its backward (rows ``R-op of ...``; numformer/finite_differences/tangent_checks.py, whose
own step and tolerance, 1e-3 with Romberg's extrapolation and 1e-7, the summary names).

The exercises (grad_checks/lab.py): ``python -m grad_checks exercise --list``,
``exercise NAME [--out DIR] [--level derive|implement]``, ``hint FILE``, ``check FILE``,
``exercise --status DIR``, ``mutants``.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from numformer.cli.arguments import NUMBERS, OneLineParser, seed_int
from numformer.cli.front import command_line
from numformer.errors import UsageError
from numformer.finite_differences import run_case
from numformer.finite_differences.tangent_checks import STEP as TANGENT_STEP
from numformer.finite_differences.tangent_checks import TOLERANCE as TANGENT_TOLERANCE
from numformer.finite_differences.tangent_checks import run_tangent_case
from numformer.kernels import MODES, get_kernels, use_kernels

from .cases import BUILDERS, checkpoint_cases, named_cases, probe_seed
from .lab import COMMANDS as LAB_COMMANDS
from .lab import main as lab_main
from .student_file import PROG

FORWARD_STREAM = 1  # forward mode's probes: the case's probe seed and this (reverse mode's stay as they were)


@command_line(PROG)
def main(argv=None) -> int:
    """The whole command, returning its exit status (tests and other commands call it; ``sys.exit(main())``
    below): the one front (numformer/cli/front.py) makes a bad flag one line (exit 2, no usage block), a user's
    mistake one line and its exit status, anything else a bug line naming the file its traceback went to."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in LAB_COMMANDS:  # the exercises: a command of their own, the checks below unchanged
        return lab_main(argv)
    return _table(argv)


def _table(argv) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                       epilog="exercises: python -m grad_checks exercise --list | exercise NAME | hint FILE "
                              "| check FILE | exercise --status DIR")
    ap.add_argument("--layer", action="append", metavar="NAME",
                    help=f"check only this layer (repeatable): {', '.join(BUILDERS)}")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--verbose", action="store_true", help="show analytic and numerical values of a few probes")
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the random weights, inputs and probes")
    ap.add_argument("--step", type=NUMBERS["finite-difference step"], default=1e-5, help="finite-difference step h (default 1e-5)")
    ap.add_argument("--tolerance", type=NUMBERS["tolerance"], default=1e-6, help="largest relative error that passes")
    ap.add_argument("--mode", choices=("both", "reverse", "forward"), default="both",
                    help="check the backward passes (reverse), the JVPs and the backward's tangents (forward), or "
                         "both (default)")
    ap.add_argument("--list", action="store_true", help="list the layer names and exit")
    ap.add_argument("--kernels", choices=MODES, default=None,
                    help="check the fast kernels (default, unless NUMFORMER_KERNELS says otherwise) or the plain math")
    ap.add_argument("--checkpoint", metavar="RUN", help="check on a trained model's weights instead of random "
                    "ones: a run folder (its averaged.npz unless newer checkpoints exist), a checkpoint, or an "
                    "exported model (.npz or .safetensors)")
    args = ap.parse_args(argv)

    if args.kernels:
        use_kernels(args.kernels)
    if args.list:
        print("\n".join(BUILDERS))
        return 0
    try:  # a missing or damaged checkpoint is a CheckpointError: one line from one_line_errors
        if args.checkpoint:
            cases = [(case.layer, case) for case in checkpoint_cases(args.layer, args.checkpoint, seed=args.seed)]
        else:
            cases = named_cases(args.layer, seed=args.seed)
    except KeyError as exc:  # a layer name there is no check of: the message names the ones there are
        raise UsageError(exc.args[0]) from None

    start = time.perf_counter()
    results = []
    for builder, case in cases:  # each case's probes from a stream of its own (cases.probe_seed)
        if args.mode != "forward":
            results += run_case(case, np.random.default_rng(probe_seed(builder, case, args.seed)), h=args.step,
                                tolerance=args.tolerance, keep_samples=4 if args.verbose else 0)
        if args.mode != "reverse" and case.jvp is not None:  # forward mode's probes: a stream of their own too
            results += run_tangent_case(case, np.random.default_rng(probe_seed(builder, case, args.seed)
                                                                    + [FORWARD_STREAM]))
    elapsed = time.perf_counter() - start
    failed = [r for r in results if not r.passed]
    worst = max((r.max_rel_error for r in results), default=0.0)

    if args.json:
        print(json.dumps({
            "checks": len(results),
            "failed": len(failed),
            "max_rel_error": worst,
            "tolerance": args.tolerance,
            "step": args.step,
            "layers": sorted({r.layer for r in results}),
            "kernels": get_kernels(),
            "mode": args.mode,
            "forward_mode_checks": sum(r.tensor.startswith(("jvp along ", "R-op of ")) for r in results),
            "kinks_skipped": sum(r.kinks for r in results),
            "refined": sum(r.refined for r in results),
            "seconds": round(elapsed, 2),
            "results": [
                {"layer": r.layer, "case": r.case, "tensor": r.tensor, "shape": list(r.shape), "probes": r.probes,
                 "max_rel_error": r.max_rel_error, "kinks_skipped": r.kinks, "refined": r.refined, "passed": r.passed}
                for r in results
            ],
        }))
        return 1 if failed else 0

    w_layer = max(len(r.layer) for r in results)
    w_tensor = max(len(r.tensor) for r in results)
    print(f"{'layer':<{w_layer}}  {'tensor':<{w_tensor}}  {'probes':>6}  {'kinks':>5}  {'worst rel err':>13}  result   case")
    for r in results:
        print(f"{r.layer:<{w_layer}}  {r.tensor:<{w_tensor}}  {r.probes:>6}  {r.kinks:>5}  {r.max_rel_error:>13.2e}  "
              f"{'pass' if r.passed else 'FAIL':<7}  {r.case}")
        for probe, a, n, e in r.samples:
            print(f"{'':<{w_layer}}    {probe:<24} analytic {a:+.10e}  numerical {n:+.10e}  rel err {e:.1e}")
    print(f"\n{len(results)} tensors checked in {elapsed:.1f} s ({get_kernels()} kernels), {len(failed)} failed, "
          f"worst relative error {worst:.2e} (tolerance {args.tolerance:.0e}, step {args.step:.0e}); "
          f"{sum(r.kinks for r in results)} probes dropped at declared kinks (replaced where the tensor was sampled), "
          f"{sum(r.refined for r in results)} refined (failing at the step, judged by Richardson's extrapolation from "
          "half of it)" + (f"; forward mode (jvp, R-op rows): step {TANGENT_STEP:.0e} with Romberg's extrapolation, "
                           f"tolerance {TANGENT_TOLERANCE:.0e}" if args.mode != "reverse" else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
