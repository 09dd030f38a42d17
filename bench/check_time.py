"""How long ``python -m grad_checks check`` takes on a right answer, for every exercise.

Each exercise's reference, written into the file a student fills in (``tests/lab_files.py``), is graded as
``check FILE`` grades it (``grad_checks.lab.check_file``: numformer's backward and the finite differences on
every case); the median of ``--repeats`` runs after one warm-up. A wrong answer costs more (its first wrong step
is looked for); a right one is what a student runs most, once per edit.

    python3 bench/check_time.py
    python3 bench/check_time.py --repeats 5 --json
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from numformer.cli.arguments import OneLineParser, positive_int  # noqa: E402  (one-line usage errors)
from numformer.cli.front import command_line  # noqa: E402  (a bug says so; see numformer/cli/front.py)

import lab_files  # noqa: E402
from grad_checks import exercises, lab  # noqa: E402

PROG = "bench/check_time.py"  # the name its one-line errors start with


@command_line(PROG)
def main(argv=None) -> int:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed runs per exercise (the median is reported)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for ex in exercises.all_exercises():
            path = str(lab_files.write(ex, ex.target, Path(folder)))
            result, status, _ = lab.check_file(path)  # warm-up, and a right answer must check exact
            assert status == 0 and result.exact, (ex.name, result.summary())
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                lab.check_file(path)
                times.append(time.perf_counter() - start)
            rows[ex.name] = statistics.median(times)
    if args.json:
        print(json.dumps({"cpu": platform.processor() or platform.machine(), "seconds": rows}))
    else:
        for name, seconds in rows.items():
            print(f"{name:<18} {seconds:7.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
