"""``python -m numformer.studies NAME [--out DIR] [--small] [its flags]`` runs one study; ``--list`` names them all.

Writes ``DIR/NAME.png``, ``DIR/NAME.md`` (the paper's claim beside numformer's measurement) and
``DIR/NAME.json``; prints progress against the study's stated time, then the table. Exit status 0 when
the study ran (whether or not its finding held: a finding that does not reproduce is a result, and the
table says so), 2 for a usage error (an unknown study, a bad flag, matplotlib missing), 1 for a bug.

A study module may add flags of its own: ``add_arguments(parser)`` adds them (shown by
``python -m numformer.studies NAME --help``) and ``config_from_args(args, cfg) -> cfg`` applies the ones given
to its configuration (``FULL``, or ``SMALL`` with ``--small``), raising a one-line UsageError for a mistake.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..kernels.host import tune_host

tune_host()  # before numpy loads, as train.py does: the warmup study trains

from ..cli.arguments import OneLineParser  # noqa: E402
from ..cli.front import command_line  # noqa: E402
from ..cli.preflight import FOLDER, check_output  # noqa: E402
from ..errors import NumformerError, UsageError, first_line  # noqa: E402
from . import STUDIES, get  # noqa: E402

PROG = "python -m numformer.studies"
#: The files every study writes into --out: OUT/NAME.png, OUT/NAME.md, OUT/NAME.json.
STUDY_FILE_SUFFIXES = (".png", ".md", ".json")


def describe() -> str:
    """One paragraph per study: name, stated time, title and citation."""
    lines = []
    for name in STUDIES:
        m = get(name)
        lines.append(f"{name}  (at most {m.MINUTES:g} min on 2 cores)\n    {m.TITLE}\n    {m.CITATION}")
    return "\n".join(lines)


def named_study(argv) -> str | None:
    """The study named on the command line (the first argument that is one), before flags are parsed: its
    own flags must be known to the parser."""
    return next((a for a in argv if a in STUDIES), None)


@command_line(PROG)
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", help=f"the study: {', '.join(STUDIES)}")
    ap.add_argument("--list", action="store_true", help="name every study, its stated time and its paper")
    ap.add_argument("--out", default="runs/studies", help="folder for the picture, table and numbers "
                                                           "(default runs/studies; prepared data goes in OUT/data)")
    ap.add_argument("--small", action="store_true", help="the small configuration the CI test runs (seconds)")
    named = named_study(argv)
    if named is not None and hasattr(get(named), "add_arguments"):
        get(named).add_arguments(ap)
    args = ap.parse_args(argv)
    if args.list:
        print(describe())
        return 0
    if args.name is None:
        ap.error(f"name a study ({', '.join(STUDIES)}) or pass --list")
    if args.name not in STUDIES:
        ap.error(f"unknown study {args.name!r}: choose one of {', '.join(STUDIES)}")
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        raise UsageError("the studies draw with matplotlib: pip install 'numformer[plot]'") from None
    study = get(args.name)
    cfg = study.SMALL if args.small else study.FULL
    if hasattr(study, "config_from_args"):
        try:
            cfg = study.config_from_args(args, cfg)
        except NumformerError as exc:  # a bad flag value: one line, exit status 2, like argparse's own
            ap.error(first_line(exc))
    check_output(args.out, "--out", [], FOLDER)  # the study's place, and each of its files, before it runs
    for suffix in STUDY_FILE_SUFFIXES:
        check_output(Path(args.out) / f"{args.name}{suffix}", "--out")
    print(f"{args.name}: {study.TITLE}\n{study.CITATION}\n", flush=True)
    results = study.run(args.out, cfg, log=lambda line: print(line, flush=True))
    print()
    print(open(results["files"][1], encoding="utf-8").read())
    for path in results["files"]:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
