#!/usr/bin/env python3
"""A measured sweep of the CPU training recipe: train.py once per setting, at one time budget, scored on validation.

For each point of the grid (the product of the values given to ``--grid``; every other setting is the preset's
recipe for M minutes, numformer/training/budget_recipe.py, which the sweeps themselves chose: name a setting in
the grid to hold it fixed), ``train.py DATA --max-minutes M --no-test`` runs in its own process, alone on the
machine, into ``OUT/<point>``;
its length penalty is then chosen on 500 validation sentences (beam 4, train.py's own choice,
numformer/decoding/valid_choice.py), and that choice's validation BLEU, brevity penalty and alpha are the point's
figures, with its steps and tokens a second. The test split is never read: recipes are chosen on validation.

A point whose folder already holds its choice is read, not trained again, so a sweep stopped part way continues
where it stopped; a point folder left half-done by a stopped run is refused in one line (delete it or give a new
``--out``). Written: ``OUT/sweep.json`` and ``OUT/sweep.md`` (the points best first, with CPU, commit and command).

    python3 bench/recipe_sweep.py --corpus bible-en-es --minutes 10 --grid warmup=250,500,1000 --out runs/sweep
    python3 bench/recipe_sweep.py --corpus messages-en-es --minutes 10 --grid lr-factor=0.5,0.7,1.0 \\
        --grid max-tokens=3000,6000 --out runs/sweep-messages
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from numformer.cli.arguments import OneLineParser, positive_float, probability  # noqa: E402  (one-line usage errors)
from numformer.training.config import RANGES as R  # noqa: E402  (train.py's own range of each flag)
from numformer.checkpoint.run_model_file import step_of  # noqa: E402
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.decoding.valid_choice import read_choice  # noqa: E402
from numformer.errors import UsageError  # noqa: E402
from numformer.run_file_names import run_checkpoints  # noqa: E402
from numformer.studies.common import markdown_table  # noqa: E402

from budget_race import machine  # noqa: E402  (the CPU, commit and versions a figure belongs to)

PROG = "bench/recipe_sweep.py"  # the name its one-line errors start with
#: train.py's flags a sweep may vary, and the type of their values.
SWEEPABLE = {"warmup": R["warmup"], "lr-factor": R["lr_factor"], "max-tokens": R["max_tokens"],
             "average-last": R["average_last"], "save-every-minutes": R["save_every_minutes"],
             "dropout": probability, "label-smoothing": probability, "clip-norm": R["clip_norm"]}
#: Decode at most MAX_SENTENCES validation sentences for the choice (valid_choice.py caps it there).
TUNE_ALL = "100000"


def grid_axis(text: str) -> tuple[str, list]:
    """``name=v1,v2,...`` -> (name, values), values typed as train.py takes them."""
    name, sep, values = text.partition("=")
    if not sep or name not in SWEEPABLE or not values:
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,... with NAME one of {', '.join(SWEEPABLE)}, got {text!r}")
    try:
        return name, [SWEEPABLE[name](v) for v in values.split(",")]
    except argparse.ArgumentTypeError as exc:  # train.py's own range for the flag (numformer/training/config.py)
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def parse_args(argv=None):
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="a corpus the project builds (train.py --corpus)")
    src.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    src.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    ap.add_argument("--minutes", type=positive_float, required=True, help="each point's training budget")
    ap.add_argument("--grid", type=grid_axis, action="append", required=True, metavar="NAME=V1,V2",
                    help=f"values of one train.py flag (repeatable: the grid is their product): {', '.join(SWEEPABLE)}")
    ap.add_argument("--preset", default=None, help="model size (default: train.py's: small on a CPU)")
    ap.add_argument("--out", required=True, help="the sweep's folder: one run folder per point, sweep.json, sweep.md")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.grid]
    if len(set(names)) != len(names):
        ap.error(f"--grid names a flag twice ({', '.join(sorted({n for n in names if names.count(n) > 1}))}): "
                 "give each flag's values once, comma-separated")
    return args


def points(grid) -> list[dict]:
    """Every combination of the grid's values, in the order given."""
    names = [n for n, _ in grid]
    return [dict(zip(names, values)) for values in itertools.product(*(v for _, v in grid))]


def point_name(point: dict) -> str:
    return "_".join(f"{k}{v:g}" for k, v in point.items())


def run_point(args, point: dict, out: Path) -> dict:
    """Train one point (or read it, when its folder holds its choice); its figures."""
    folder = out / point_name(point)
    choice = folder / "decoding.json"
    if folder.exists() and not choice.exists():
        raise UsageError(f"{folder} was left half-done by a stopped sweep: delete it (or give a new --out) to run "
                         "that point again")
    if not choice.exists():
        data = ["--corpus", args.corpus] if args.corpus else ["--data", args.data] if args.data else ["--task", args.task]
        flags = [x for k, v in point.items() for x in (f"--{k}", f"{v:g}")]
        cmd = [sys.executable, str(ROOT / "train.py"), *data, "--max-minutes", f"{args.minutes:g}", "--out", str(folder),
               "--no-test", "--no-progress", "--tune-seconds", TUNE_ALL, *flags,
               *(["--preset", args.preset] if args.preset else [])]
        code = subprocess.call(cmd)
        if code != 0:
            raise UsageError(f"the point {folder.name} ({' '.join(cmd[1:])}) exited {code}: its messages are above")
    chosen = read_choice(folder)
    if chosen is None:
        raise UsageError(f"{choice} does not read as a length-penalty choice: delete {folder} to run that point again")
    best = chosen.best()
    metrics = folder / "metrics.jsonl"  # none when the run was shorter than one log interval
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    return {"point": folder.name, **point, "steps": step_of(run_checkpoints(folder)[-1]),  # the run's last checkpoint
            "tokens_per_s": round(sum(speeds) / len(speeds)) if speeds else None,
            "valid_bleu": best["bleu"], "valid_bp": best["bp"], "alpha": chosen.alpha,
            "valid_sentences": chosen.sentences}


def table(report: dict) -> str:
    """The points as a markdown table, best validation BLEU first, with the machine line."""
    names = report["flags"]
    rows = [[*(f"{r[n]:g}" for n in names), r["steps"], r["tokens_per_s"], f"{r['valid_bleu']:.2f}",
             f"{r['valid_bp']:.3f}", f"{r['alpha']:g}"] for r in sorted(report["points"], key=lambda r: -r["valid_bleu"])]
    m = report["machine"]
    return markdown_table([*names, "steps", "tokens/s", "valid BLEU", "BP", "alpha"], rows) + (
        f"\n{report['minutes']:g} min a point, {report['valid_sentences']} validation sentences; {m['cpu']}, commit "
        f"{m['commit']}, {m['date']}; `{report['command']}`\n")


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = points(args.grid)
    report = {"command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]), "machine": machine(),
              "minutes": args.minutes, "flags": [n for n, _ in args.grid], "points": []}
    t0 = time.perf_counter()
    for i, point in enumerate(plan, 1):
        spent = (time.perf_counter() - t0) / 60
        print(f"sweep: point {i} of {len(plan)} ({point_name(point)}); {spent:.0f} min spent, about "
              f"{(len(plan) - i + 1) * (args.minutes + 1.5):.0f} min left", flush=True)
        report["points"].append(run_point(args, point, out))
    report["valid_sentences"] = min(p["valid_sentences"] for p in report["points"])
    (out / "sweep.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "sweep.md").write_text(table(report))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
