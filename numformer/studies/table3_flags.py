"""table3's command line: the flags ``python -m numformer.studies table3`` adds (``add_arguments``) and the
:class:`~numformer.studies.table3_config.Config` they make (``config_from_args``); numformer.studies.__main__
calls both through the study module. ``--rows`` names rows and groups of Table 3 (Vaswani et al. 2017,
Section 6.2) as :data:`numformer.presets.TABLE3` does.
"""
from __future__ import annotations

from dataclasses import replace

from ..cli.arguments import NUMBERS, nonneg_int, positive_int, seed_int
from ..errors import UsageError
from ..presets import TABLE3
from .table3_config import GROUPS, SCALES, Config


def add_arguments(parser) -> None:
    """This study's flags (``python -m numformer.studies table3 --help``)."""
    g = parser.add_argument_group("table3")
    g.add_argument("--rows", help="rows to train, comma-separated group letters and/or row names, e.g. A,D,E or "
                                  f"A-h1,E (base is always run; rows: {', '.join(TABLE3)})")
    g.add_argument("--scale", choices=SCALES, help="small: each row's change applied to a CPU-sized base "
                                                    "(default); full: the paper's shapes (for a GPU)")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=positive_int, help="training steps per run (default 1000)")
    budget.add_argument("--minutes", type=NUMBERS["minutes"], help="training minutes per run (instead of --steps)")
    g.add_argument("--seeds", help="comma-separated seeds, each row trained once per seed (default 1,2)")
    source = g.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="a corpus numformer builds (default bible-en-es)")
    source.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    g.add_argument("--warmup", type=positive_int, help="warm-up steps of Eq. 3 (default: a fifth of --steps)")
    g.add_argument("--dev-sentences", type=nonneg_int, help="dev BLEU on this many valid sentences (default 200)")
    g.add_argument("--device", help="cpu or cuda (default: $NUMFORMER_DEVICE or cpu)")


def parse_rows(text: str) -> tuple:
    """``"A,D,E"`` or ``"A-h1,E"`` -> the row names in Table 3's order, base first (UsageError if unknown)."""
    chosen = {"base"}
    by_lower = {name.lower(): name for name in TABLE3}
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.upper() in GROUPS:
            chosen.update(name for name, row in TABLE3.items() if row.group == token.upper())
        elif token.lower() in by_lower:
            chosen.add(by_lower[token.lower()])
        else:
            raise UsageError(f"--rows: unknown row or group {token!r}: give group letters {', '.join(GROUPS)} "
                             f"or rows {', '.join(TABLE3)}")
    return tuple(name for name in TABLE3 if name in chosen)


def parse_seeds(text: str) -> tuple:
    try:
        seeds = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UsageError(f"--seeds takes comma-separated whole numbers, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or any(s not in seed_int for s in seeds):
        raise UsageError(f"--seeds takes distinct seeds, each {seed_int.words()}, got {text!r}")
    return seeds


def config_from_args(args, cfg: Config) -> Config:
    """``cfg`` (FULL, or SMALL with --small) changed by the flags given; a mistake is a one-line UsageError."""
    changes = {}
    if args.rows is not None:
        changes["rows"] = parse_rows(args.rows)
    if args.scale is not None:
        changes["scale"] = args.scale
        if args.scale == "full":
            changes["base_overrides"] = ()  # the paper's own shapes: nothing of the small base applies
    if args.steps is not None:
        changes.update(steps=args.steps, minutes=None)
    if args.minutes is not None:
        changes.update(minutes=args.minutes, steps=None)
    if args.seeds is not None:
        changes["seeds"] = parse_seeds(args.seeds)
    if args.corpus is not None:
        changes.update(corpus=args.corpus, data=None, task=None)
    if args.data is not None:
        from ..data.text_files import check_corpus_dir  # noqa: PLC0415

        changes.update(data=str(check_corpus_dir(args.data).resolve()), corpus=None, task=None)
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    if args.dev_sentences is not None:
        changes["dev_sentences"] = args.dev_sentences
    if args.device is not None:
        changes["device"] = args.device
    return replace(cfg, **changes).checked()
