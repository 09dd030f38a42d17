#!/usr/bin/env python3
"""numformer trained for T minutes against PyTorch at its best trained for k x T (default 2T), one after the other.

The goal of "more BLEU per CPU minute": in T minutes numformer reaches at least the test BLEU PyTorch reaches in 2T,
with the same architecture and data. Both sides run train.py's flow, so everything but the step is the same code:

1. ``train.py DATA --max-minutes T --out OUT/numformer-T`` (numformer's step);
2. ``bench/torch_trainer.py DATA --max-minutes kT --out OUT/pytorch-kT`` (the step in PyTorch: fused Q/K/V,
   ``scaled_dot_product_attention``, fused Adam; the same preset, batches, schedule, checkpoints, averaging,
   the length penalty chosen on the validation split and numformer's beam search on the test set);
3. with ``--equal``, also PyTorch for T minutes (``OUT/pytorch-T``): the lead at the same budget.

Each side runs in its own process, alone on the machine (the budget is wall time of training steps: another
program on the cores would slow either side), and shows its own progress bar against its budget. Flags after
``--`` go to every side (e.g. ``-- --max-tokens 4000 --seed 2``). Written: ``OUT/race-plan.json`` (the settings,
first), ``OUT/race.json`` (every side's scores, steps, tokens a second, with the CPU model, the commit and the
PyTorch version) and ``OUT/race.md`` (the table).

A race stopped part way continues where it stopped: the same command again reads the sides that finished (their
folder holds ``test_scores.json``) and trains the others; ``--equal`` may be added later. A side's folder left
half-done, or an OUT whose plan has other settings, is refused in one line: no run is overwritten.

    python3 bench/budget_race.py --corpus bible-en-es --minutes 10 --out runs/race-bible
    python3 bench/budget_race.py --data my_corpus/ --minutes 20 --times 2 --equal --out runs/race-mine
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from numformer.cli.arguments import OneLineParser, positive_float  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)
from numformer.errors import UsageError  # noqa: E402
from numformer.studies.common import markdown_table  # noqa: E402

PROG = "bench/budget_race.py"  # the name its one-line errors start with
RACE_JSON, RACE_MD, PLAN_JSON = "race.json", "race.md", "race-plan.json"


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    shared = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                       epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", help="a corpus the project builds (train.py --corpus)")
    src.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    src.add_argument("--task", choices=["copy", "reverse"], help="a synthetic task")
    ap.add_argument("--minutes", type=positive_float, default=10.0, help="numformer's training budget T (default 10)")
    ap.add_argument("--times", type=positive_float, default=2.0, help="PyTorch's budget as a multiple of T (default 2)")
    ap.add_argument("--equal", action="store_true", help="also train PyTorch for T minutes")
    ap.add_argument("--preset", default=None, help="model size for every side (default: train.py's: small on a CPU)")
    ap.add_argument("--out", required=True, help="a new folder for the race: one run folder per side, race.json, race.md")
    args = ap.parse_args(own)
    args.shared = shared
    for flag in ("--max-minutes", "--max-steps", "--out", "--resume", "--corpus", "--data", "--task", "--preset"):
        if any(a == flag or a.startswith(flag + "=") for a in shared):
            ap.error(f"{flag} after -- would make the sides differ or clash with the race's own: set it before --"
                     if flag in ("--corpus", "--data", "--task", "--preset", "--out") else
                     f"{flag} after --: the race sets each side's budget itself (--minutes, --times)")
    return args


def sides(args) -> list[tuple[str, str, float]]:
    """(name, command file, minutes) of every side, in the order they run."""
    t = args.minutes
    out = [(f"numformer-{t:g}min", "train.py", t), (f"pytorch-{args.times * t:g}min", "bench/torch_trainer.py", args.times * t)]
    if args.equal:
        out.append((f"pytorch-{t:g}min", "bench/torch_trainer.py", t))
    return out


def plan_of(args) -> dict:
    """What makes a race's sides comparable: the data, the budgets and every flag the sides share."""
    return {"corpus": args.corpus, "data": args.data, "task": args.task, "minutes": args.minutes, "times": args.times,
            "preset": args.preset, "shared": args.shared}


def check_folder(out: Path, plan: dict, names) -> list[str]:
    """The sides already done in ``out`` (to be read, not trained again); a refusal in one line when ``out`` holds a
    race of other settings, or a side's folder without its test scores (a run stopped part way)."""
    saved = out / PLAN_JSON
    if saved.exists() and json.loads(saved.read_text()) != plan:
        raise UsageError(f"{out} holds a race with other settings ({saved}): give a new --out "
                         "(an earlier race's runs are kept)")
    present = [n for n in names if (out / n).exists()]
    if present and not saved.exists():
        raise UsageError(f"{out} holds {', '.join(present)} but no {PLAN_JSON}: give a new --out")
    half = [n for n in present if not (out / n / "test_scores.json").exists()]
    if half:
        raise UsageError(f"{out / half[0]} was left half-done by a stopped race: delete it (or give a new --out) "
                         "to train that side again")
    return present


def run_side(args, name: str, command: str, minutes: float, out: Path, done: bool) -> dict:
    """Train one side in its own process (unless ``done``: then read); its scores from the run folder."""
    data = (["--corpus", args.corpus] if args.corpus else ["--data", args.data] if args.data else ["--task", args.task])
    cmd = [sys.executable, str(ROOT / command), *data, "--max-minutes", f"{minutes:g}", "--out", str(out / name),
           *(["--preset", args.preset] if args.preset else []), *args.shared]
    t0 = time.perf_counter()
    code = 0 if done else subprocess.call(cmd)
    if code != 0:
        raise UsageError(f"the side {name} ({' '.join(cmd[1:])}) exited {code}: its messages are above; "
                         f"the race stops (the runs done so far are kept in {out})")
    scores = json.loads((out / name / "test_scores.json").read_text())
    metrics = out / name / "metrics.jsonl"  # none when the run was shorter than one log interval
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    speeds = [r["tokens_per_s"] for r in steps if "tokens_per_s" in r]
    return {"side": name, "command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd)),
            "budget_minutes": minutes, "trained_minutes": scores.get("train_minutes"), "steps": scores.get("steps"),
            "tokens_per_s": round(sum(speeds) / len(speeds)) if speeds else None,
            "bleu": scores["bleu"], "chrf": scores["chrf"], "brevity_penalty": scores.get("brevity_penalty"),
            "length_ratio": scores.get("length_ratio"), "alpha": scores.get("alpha"),
            "alpha_from": scores.get("alpha_from"),
            "wall_minutes": None if done else round((time.perf_counter() - t0) / 60, 1)}


def machine() -> dict:
    """The CPU model, the commit and the library versions the figures belong to."""
    import torch  # noqa: PLC0415  (the reference's version)

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "commit": commit or "unknown", "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def table(report: dict) -> str:
    """The race as a markdown table, with its machine line."""
    rows = [[r["side"], f"{r['budget_minutes']:g} min", r["steps"], r["tokens_per_s"], f"{r['bleu']:.2f}",
             f"{r['chrf']:.2f}", f"{r['brevity_penalty']:.3f}", f"{r['length_ratio']:.3f}",
             f"{r['alpha']:g} ({r['alpha_from']})"] for r in report["sides"]]
    m = report["machine"]
    return markdown_table(["side", "budget", "steps", "tokens/s", "test BLEU", "chrF", "BP", "length ratio", "alpha"],
                          rows) + (f"\n{report['verdict']}\n\n{m['cpu']}, commit {m['commit']}, PyTorch {m['torch']}, "
                                   f"{m['date']}; `{report['command']}`\n")


@command_line(PROG)
def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    plan = sides(args)
    done = check_folder(out, plan_of(args), [name for name, _, _ in plan])
    out.mkdir(parents=True, exist_ok=True)
    (out / PLAN_JSON).write_text(json.dumps(plan_of(args), indent=1) + "\n")
    report = {"command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]), "machine": machine(), "sides": []}
    for i, (name, command, minutes) in enumerate(plan, 1):
        print(f"race: side {i} of {len(plan)}, {name}: " + ("done before, read from its folder" if name in done else
              f"{minutes:g} min of training, then validation and the test set"), flush=True)
        report["sides"].append(run_side(args, name, command, minutes, out, name in done))
    ours, theirs = report["sides"][0], report["sides"][1]
    report["verdict"] = (f"numformer in {args.minutes:g} min: BLEU {ours['bleu']:.2f}; PyTorch in "
                         f"{args.times * args.minutes:g} min: {theirs['bleu']:.2f}: goal "
                         f"{'met' if ours['bleu'] >= theirs['bleu'] else 'not met'} "
                         f"({ours['bleu'] - theirs['bleu']:+.2f} BLEU)")
    (out / RACE_JSON).write_text(json.dumps(report, indent=1) + "\n")
    (out / RACE_MD).write_text(table(report))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
