"""Command line of the exercises: ``python -m grad_checks exercise|check|mutants ...``.

    python -m grad_checks exercise --list                  the exercises, in the order to learn them
    python -m grad_checks exercise layernorm [--out DIR]   write DIR/my_layernorm.py to fill in
                                     [--level derive|implement]  derive (default): the forward only;
                                                                 implement: the backward's equations too
    python -m grad_checks hint my_layernorm.py             the derivation, one more step each time
    python -m grad_checks check my_layernorm.py            grade it (exit 0 right, 1 wrong)
    python -m grad_checks exercise --status DIR            which exercises in DIR check exact
    python -m grad_checks check --exercise layernorm FILE  a file without an EXERCISE line
    python -m grad_checks mutants [--exercise NAME]        how many mutants of the references the grading catches

check and exercise --status give each case of the student's code 10 s (--time-limit SECONDS; 0: no limit):
code that does not return in time stops the grading in one line naming the case and the file:line it was at.

Exit status: 0 passed (or done), 1 the graded code is wrong, raises or is not written yet,
2 a mistake on the command line (no such file or exercise, a file that would be overwritten) or code that
did not return within the time limit.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from numformer.cli.arguments import NUMBERS, OneLineParser, positive_int, path_argument, seed_int
from numformer.cli.one_line_errors import one_line_errors
from numformer.cli.preflight import FOLDER, check_output
from numformer.files import atomic_write_text

from . import exercises
from numformer.user_code_clock import DEFAULT_TIME_LIMIT
from .exercise import LEVELS, skeleton
from .hints import HintError, hint
from .student_folder import folder_status, status_table
from .student_file import PROG, check_file

COMMANDS = ("exercise", "check", "hint", "mutants")


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    ex = sub.add_parser("exercise", help="write an exercise file, or list them")
    ex.add_argument("name", nargs="?", help="the exercise (see --list)")
    ex.add_argument("--list", action="store_true", help="list the exercises in the order to learn them")
    ex.add_argument("--out", default=".", metavar="DIR", help="folder to write my_NAME.py into (default: here)")
    ex.add_argument("--force", action="store_true", help="overwrite an existing file (your work in it is lost)")
    ex.add_argument("--level", choices=LEVELS, default="derive",
                    help="derive (default): the forward, the shapes and what to return, the backward yours to "
                         "derive (python -m grad_checks hint FILE helps a step at a time); implement: the "
                         "backward's equations are given, the code is yours")
    ex.add_argument("--status", metavar="DIR", help="grade every exercise file in DIR and list which check exact")
    _time_limit_flag(ex)
    hi = sub.add_parser("hint", help="the next step of an exercise's derivation")
    hi.add_argument("file", type=path_argument, help="the exercise file (my_layernorm.py)")
    hi.add_argument("--step", type=positive_int, metavar="K", help="show the steps up to K (default: one more than last time)")
    hi.add_argument("--all", action="store_true", help="show every step, the whole derivation")
    ck = sub.add_parser("check", help="grade an exercise file")
    ck.add_argument("file", type=path_argument, help="the exercise file (my_layernorm.py)")
    ck.add_argument("--exercise", metavar="NAME", help="the exercise the file answers (default: its EXERCISE line)")
    ck.add_argument("--seed", type=seed_int, default=0, help="seed of the weights, inputs and upstream gradients")
    _time_limit_flag(ck)
    mu = sub.add_parser("mutants", help="mutate the reference solutions and count how many the grading catches")
    mu.add_argument("--exercise", metavar="NAME", action="append", help="only this exercise (repeatable)")
    mu.add_argument("--verbose", action="store_true", help="list every mutant, not only the survivors")
    return ap


def _time_limit_flag(ap) -> None:
    ap.add_argument("--time-limit", type=NUMBERS["seconds or 0"], default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                    help=f"stop a case of your code that has not returned after SECONDS (default "
                         f"{DEFAULT_TIME_LIMIT:g}; every case takes under a second when the code is right; "
                         "0: no limit, to step through it in a debugger)")


def _error(message: str, status: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def list_exercises() -> str:
    rows, every = [], exercises.all_exercises()
    width = max(len(ex.name) for ex in every)  # the names line up, however long the longest
    for i, ex in enumerate(every, 1):
        swap = f"--swap {ex.swap}" if ex.swap else "(no layer to swap)"
        rows.append(f"{i:>2}  {ex.name:<{width}} {ex.title + (' (' + ex.paper + ')' if ex.paper else ''):<72} "
                    f"{len(ex.mistakes)} mistakes  {swap}")
    return "\n".join(rows)


def write_exercise(name: str, out: str = ".", force: bool = False, level: str = "derive") -> Path:
    """Write the exercise file ``OUT/my_NAME.py`` at ``level``; refuses to overwrite unless ``force``."""
    ex = exercises.get(name)
    path = Path(out) / f"my_{ex.name}.py"
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists and may hold your work: check it, delete it, or pass --force "
                              "(or another --out)")
    # atomic: a killed or full-disk write never leaves half a skeleton where the student's work will go
    return atomic_write_text(path, skeleton(ex, exercises.number(ex.name), len(exercises.ORDER), str(path), level))


def main(argv) -> int:
    """The exercises' commands. A bad flag is one line (OneLineParser, exit 2); the parsing and the command run
    inside one_line_errors: a user's mistake (StudentCodeTimeout among them) is one line and its exit status,
    a bug of ours one line saying so, the traceback in a file."""
    with one_line_errors(PROG):
        return _run(_parser().parse_args(argv))


def _run(args) -> int:
    try:
        if args.command == "exercise":
            if args.list:
                print(list_exercises())
                return 0
            if args.status:
                rows = folder_status(args.status, args.time_limit)
                print(status_table(rows, args.status))
                return 0 if all(r.state == "exact" for r in rows) else 1
            if not args.name:
                return _error("name an exercise, or pass --list or --status DIR")
            check_output(args.out, "--out", [], FOLDER)  # a file or an unwritable place: said before anything else
            path = write_exercise(args.name, args.out, args.force, args.level)
            ex = exercises.get(args.name)
            print(f"wrote {path} (level {args.level}): write the body of {ex.student_name} in it, then check it "
                  f"with\n    {PROG} check {path}"
                  + (f"\nstuck? one step of the derivation at a time: {PROG} hint {path}"
                     if args.level == "derive" else ""))
            return 0
        if args.command == "hint":
            print(hint(args.file, args.step, args.all))
            return 0
        if args.command == "check":
            result, status, message = check_file(args.file, args.exercise, args.seed, time_limit=args.time_limit)
            if result is None:
                return _error(message, status)
            print(result)
            ex = result.exercise
            if result.passed and ex.swap:
                print(f"\ntrain with it: python3 train.py --task copy --preset tiny --max-steps 300 "
                      f"--swap {ex.swap}={args.file}:{ex.layer.__name__}")
            return status
        from .mutation_testing import main as mutants_main  # noqa: PLC0415

        return mutants_main(args.exercise, args.verbose)
    except exercises.UnknownExercise as exc:
        return _error(exc.args[0])
    except (FileExistsError, FileNotFoundError, HintError) as exc:
        return _error(str(exc))
