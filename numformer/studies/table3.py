"""table3: the paper's Table 3 ablation (variations on the base model), each row trained alike and compared.

Paper: A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (arXiv:1706.03762), Section 6.2 and
Table 3 (variations on the Transformer architecture, En-De newstest2013 dev, no checkpoint averaging).

Claim: changing the base model in one set of columns moves its dev perplexity (per word-piece) and BLEU
in these directions: (A) one attention head is worse than the best head count (the computation held
constant); (B) a smaller key size d_k is worse; (C) bigger models are better (N, d_model, d_ff);
(D) dropout helps (no dropout is worse) while label smoothing hurts perplexity (eps_ls 0 has the lower
PPL; the paper: "hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU");
(E) learned positional embeddings are about equal to the sinusoids.

What numformer runs: every chosen row (``--rows``: group letters and/or row names of
:data:`numformer.presets.TABLE3`; ``base`` always, since every direction compares with it) with numformer's
own Trainer, one after the other, each for every seed, with the same data, the same budget (``--steps`` or
``--minutes`` per run) and, for a seed, the same batches in the same order and the same initial draw of every
weight the rows share. The schedule is Eq. 3 (each row's own d_model, as in the paper) with a warm-up of a
fifth of the step budget (``--warmup`` to change; 120 steps under a ``--minutes`` budget), times
``lr_factor``: 0.25 at small scale, a peak of 2.0e-3 for d_model 128 and 600 steps (about the small recipe's
1.96e-3). Chosen on base, seed 1, 600 steps of bible-en-es: dev PPL 146 / 124 / 130 / 142 / 289 at 0.15 / 0.25
/ 0.4 / 0.7 / 1.0 (BLEU 2.3 / 3.0 / 1.2 / 0.4 / 0.4). No checkpoint averaging (Table 3 has none). After
training: dev PPL = exp of the unsmoothed NLL per target word-piece over the whole valid split; dev BLEU =
sacreBLEU of the first ``--dev-sentences`` valid sentences decoded with the paper's beam 4 and length penalty
alpha 0.6 (output at most input + 50). The table puts the paper's dev PPL and BLEU beside numformer's mean
over seeds and its spread (min..max), and says per group whether the paper's direction held, reversed, or fell
inside the seed spread (the difference smaller than the larger of the two rows' min..max ranges). The
directions are judged on PPL, as the paper's wording is; the picture shows both.

Shapes and seeds: at ``--scale small`` (the default) each row applies the same relative change to
:data:`SMALL_BASE` (:meth:`numformer.presets.Table3Row.applied_to`): N 3, d_model 128, d_ff 512, h 8 (d_k =
d_v = 16), P_drop 0.1, eps_ls 0.1. Why this base: 8 heads, as the paper's, so each row A ratio (h 1, 4, 16, 32
of 8) is a whole number of heads with d_k = d_v = 128, 32, 8, 4 (computation constant, as in the paper); 3
layers, half the paper's 6, so row C's N 2 / 4 / 8 become 1 / 2 / 4 layers; d_model 128 so that the 20
trainings of ``FULL`` fit about an hour on 2 cores (2.4M parameters with bible-en-es's 8,000-piece vocabulary;
0.16 s a step of 2,000 tokens, about 2 minutes a run with its evaluation). Row B keeps d_v 16 (the paper's
blank d_v column keeps base's 64). At ``--scale full`` every row is the paper's own shape (N 6, d_model 512,
d_ff 2048, h 8; the vocabulary is the corpus's), for a GPU (``--device cuda``; batches of 12,500 tokens and
Eq. 3 at 1.0x unless told otherwise). ``FULL``: rows A, D and E plus base, 1,000 steps of 2,000 tokens each,
seeds 1 and 2, bible-en-es: 20 trainings. ``SMALL`` (the CI's): base and A-h1 on a base of width 32 (2
layers), the synthetic copy task, 30 steps of 600 tokens, seeds 1 and 2, 10 dev sentences.

Resume: each finished (row, seed) writes ``OUT/table3/ROW-seedS/result.json`` (atomically) and drops its
checkpoint; a started study reads the finished runs back and trains only the others, so a stopped study
resumes at the row it was on. Those files are the study's record: the table (``OUT/table3.md``, ``.json``,
``.png``, each written to a temporary beside it and renamed over it) is rendered from every finished run in
the folder, so a start with other ``--rows`` (``--rows A`` after ``--rows D``) adds its rows to the table
rather than dropping the ones run before; a row run again replaces its own results. A run stopped inside
its training (Ctrl-C or SIGTERM: the Trainer saves a checkpoint; a periodic one every 5 minutes otherwise)
continues from its checkpoint through ``Trainer.resume`` (bit-identical to an uninterrupted run on the
CPU); a run folder without a checkpoint is started again clean. ``OUT/table3/study.json`` holds the
settings results depend on (scale, budget, data and its vocabulary, batch size, schedule, decoding; not the
rows or seeds, which may grow between starts): other settings refuse to start, in one line, rather than mix
results.

What numformer found (``FULL``, commit a15135d; ``table3.md`` has the table): base's dev PPL 80.7
(80.3..81.0 over the two seeds), BLEU 7.6. Of the paper's directions, label smoothing's held (eps_ls 0: PPL
76.7, below base; eps_ls 0.2: 87.0, above), outside the seed spread. Three reversed, each far outside it:
one head was the best head count, not the worst (PPL 77.4, then h 4 78.6, h 8 80.7, h 16 82.9, h 32 86.7:
at d_model 128 the heads of h 16 and 32 are 8 and 4 wide); no dropout was the best row (71.9) and P_drop
0.2 the worst (93.1); learned positions were 11.9% worse than the sinusoids (90.3), where the paper found
them equal. BLEU (200 sentences) ranks the rows as PPL does except label smoothing's: eps_ls 0 has the
lower PPL but a BLEU of 7.3 (6.9..7.7) against base's 7.6, eps_ls 0.2 the higher PPL but 7.8 (7.83..7.84),
the paper's "hurts perplexity ... but improves accuracy and BLEU" in direction, at the edge of the seed
spread.

Where it differs: the paper trains each row 100k steps of 25k + 25k tokens on WMT14 En-De (4.5M pairs) and
scores newstest2013; here 1,000 steps of 2,000 tokens on bible-en-es (28k pairs, about one epoch), a model
about 1/27 of base's size, scored on bible-en-es's own valid split. Early in training more capacity and less
regularisation can rank differently than after 100k steps (dropout cannot help a model that has not yet
seen a sentence twice), so a direction that does not hold here is a statement about this budget. The
same goes for row E: a learned table starts as noise (N(0, 1/2), the sinusoids' scale) and must be
learned from the data in 1,000 steps, where the sinusoids are right from step 0; and at d_model 128 the
heads of rows A-h16 and A-h32 are 8 and 4 wide, narrower than any head of the paper (16).

Command: ``python -m numformer.studies table3 [--rows A,D,E] [--scale small|full] [--steps S | --minutes M]
[--seeds 1,2] [--corpus NAME | --data DIR] [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most 60 minutes on 2 cores for ``FULL``; measured 54.5 minutes (3,265 s of training and
evaluation: about 2.6 minutes a run, 0.15 s a step) on the project's 2-core AMD EPYC, nothing else running.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..backend import resolve_device, xp_for
from ..checkpoint import vocab_fingerprint
from ..decoding.search import PAPER_ALPHA, PAPER_BEAM
from ..decoding.translation import DecodeOptions
from ..errors import StopTraining, UsageError
from ..files import write_json
from ..model import Transformer
from ..plot import read_jsonl
from ..presets import PAPER_COLUMNS, TABLE3, ModelConfig, count_parameters
from ..run_files import CHECKPOINTS, METRICS, run_checkpoints
from ..training.config import TrainConfig
from ..training.trainer import Trainer
from ..training.validation import evaluate
from .common import Budget, pyplot, save_figure, write_outputs

NAME = "table3"
TITLE = "Vaswani et al. 2017, Table 3: variations on the base Transformer, each row against base"
CITATION = ("A. Vaswani et al., Attention Is All You Need, NeurIPS 2017 (arXiv:1706.03762), Section 6.2 and "
            "Table 3 (variations on the Transformer architecture, En-De newstest2013 dev)")
MINUTES = 60  # stated time of FULL on 2 cores (measured 54.5 min; see the docstring)

#: The CPU-sized base every row's relative change is applied to at ``--scale small`` (the docstring says why).
SMALL_BASE = ModelConfig(d_model=128, d_ff=512, heads=8, layers=3, dropout=0.1, label_smoothing=0.1)
#: The groups of Table 3, in the paper's order (``big`` is a row of its own; it has no direction here).
GROUPS = ("A", "B", "C", "D", "E")
#: Row E's direction ("about equal"): held when learned is within the seed spread of base or this close.
E_TOLERANCE = 0.02
SCALES = ("small", "full")
#: Defaults of the settings that depend on the scale (None in :class:`Config`).
SCALE_DEFAULTS = {"small": {"max_tokens": 2000, "lr_factor": 0.25, "minutes_warmup": 120},
                  "full": {"max_tokens": 12500, "lr_factor": 1.0, "minutes_warmup": 1000}}  # GPU_RECIPES["base"]
#: A run writes a checkpoint this often (minutes of training) besides at its end: what a killed run loses.
SAVE_EVERY_MINUTES = 5
RESULT = "result.json"
STUDY_FILE = "study.json"


@dataclass(frozen=True)
class Config:
    rows: tuple = ("base", "A-h1", "A-h4", "A-h16", "A-h32", "D-drop0.0", "D-drop0.2", "D-ls0.0", "D-ls0.2",
                   "E-learned")
    scale: str = "small"                 # "small": SMALL_BASE changed by each row's ratios; "full": the paper's shapes
    steps: int | None = 1000             # per run; exactly one of steps and minutes
    minutes: float | None = None         # per run (training time; evaluation not counted)
    seeds: tuple = (1, 2)
    corpus: str | None = "bible-en-es"   # exactly one of corpus, data (a folder of text files) and task
    data: str | None = None
    task: str | None = None              # "copy" or "reverse" (synthetic; the CI's)
    vocab_size: int | None = None        # None: the corpus's default (8,000 pieces for bible-en-es)
    max_tokens: int | None = None        # batch tokens (source + target); None: SCALE_DEFAULTS
    warmup: int | None = None            # None: steps // 5, or SCALE_DEFAULTS' under a minutes budget
    lr_factor: float | None = None       # times Eq. 3; None: SCALE_DEFAULTS
    dev_sentences: int = 200             # dev BLEU on this many valid sentences (beam search)
    beam: int = PAPER_BEAM
    alpha: float = PAPER_ALPHA
    base_overrides: tuple = ()           # ((field, value), ...) changed in SMALL_BASE (the CI's narrower model)
    device: str | None = None            # None: $NUMFORMER_DEVICE or cpu (not part of the study's settings)
    log_every: int = 10

    def checked(self) -> "Config":
        """Refuse, in one line (UsageError), settings the study cannot run; returns self."""
        if self.scale not in SCALES:
            raise UsageError(f"--scale must be small or full, got {self.scale!r}")
        if (self.steps is None) == (self.minutes is None):
            raise UsageError("give --steps or --minutes (one of the two): the budget of every run")
        if self.steps is not None and self.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {self.steps}")
        if self.minutes is not None and not self.minutes > 0:
            raise UsageError(f"--minutes must be positive, got {self.minutes}")
        if sum(x is not None for x in (self.corpus, self.data, self.task)) != 1:
            raise UsageError("give exactly one of --corpus NAME and --data DIR")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"--seeds must name at least one seed, each once, got {self.seeds}")
        if self.base_overrides and self.scale != "small":
            raise UsageError("base_overrides change the small base: they apply at --scale small only")
        unknown = [r for r in self.rows if r not in TABLE3]
        if unknown or "base" not in self.rows:
            raise UsageError(f"rows {unknown} are not rows of Table 3" if unknown else "the rows must include base")
        if self.dev_sentences < 0:
            raise UsageError(f"--dev-sentences must be at least 0, got {self.dev_sentences}")
        return self


FULL = Config()
#: The CI's: two rows on a base of width 32, the copy task (no corpus to build), 30 steps, two seeds.
SMALL = Config(rows=("base", "A-h1"), steps=30, corpus=None, task="copy", max_tokens=600, lr_factor=1.0,
               warmup=10, dev_sentences=10, base_overrides=(("d_model", 32), ("d_ff", 128), ("layers", 2)),
               log_every=5)


# -- the command line (numformer.studies.__main__ calls these) ----------------------------------------------
def add_arguments(parser) -> None:
    """This study's flags (``python -m numformer.studies table3 --help``)."""
    g = parser.add_argument_group("table3")
    g.add_argument("--rows", help="rows to train, comma-separated group letters and/or row names, e.g. A,D,E or "
                                  f"A-h1,E (base is always run; rows: {', '.join(TABLE3)})")
    g.add_argument("--scale", choices=SCALES, help="small: each row's change applied to a CPU-sized base "
                                                    "(default); full: the paper's shapes (for a GPU)")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, help="training steps per run (default 1000)")
    budget.add_argument("--minutes", type=float, help="training minutes per run (instead of --steps)")
    g.add_argument("--seeds", help="comma-separated seeds, each row trained once per seed (default 1,2)")
    source = g.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="a corpus numformer builds (default bible-en-es)")
    source.add_argument("--data", metavar="DIR", help="a folder with train/valid/test .src/.tgt files")
    g.add_argument("--warmup", type=int, help="warm-up steps of Eq. 3 (default: a fifth of --steps)")
    g.add_argument("--dev-sentences", type=int, help="dev BLEU on this many valid sentences (default 200)")
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
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds takes distinct whole numbers >= 0, got {text!r}")
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


# -- what a run is --------------------------------------------------------------------------------------
def settings(cfg: Config) -> dict:
    """The settings every run's result depends on, Nones resolved (OUT/table3/study.json holds them):
    everything in ``cfg`` but the rows, seeds, device and logging."""
    d = SCALE_DEFAULTS[cfg.scale]
    warmup = cfg.warmup if cfg.warmup is not None else (
        max(1, cfg.steps // 5) if cfg.steps is not None else d["minutes_warmup"])
    return {"scale": cfg.scale, "steps": cfg.steps, "minutes": cfg.minutes, "corpus": cfg.corpus, "data": cfg.data,
            "task": cfg.task, "vocab_size": cfg.vocab_size,
            "max_tokens": cfg.max_tokens if cfg.max_tokens is not None else d["max_tokens"], "warmup": warmup,
            "lr_factor": cfg.lr_factor if cfg.lr_factor is not None else d["lr_factor"],
            "dev_sentences": cfg.dev_sentences, "beam": cfg.beam, "alpha": cfg.alpha,
            "base_overrides": [list(kv) for kv in cfg.base_overrides]}


def load_data(cfg: Config, folder: Path, log=print):
    """The study's data, prepared under ``folder`` (OUT/data) on first use and reused after."""
    from ..data.prepared import prepare  # noqa: PLC0415

    say = lambda line: log(f"data: {line}")  # noqa: E731
    v = f"-v{cfg.vocab_size}" if cfg.vocab_size is not None else ""
    if cfg.task is not None:
        return prepare(folder / f"{cfg.task}{v}", task=cfg.task, vocab_size=cfg.vocab_size, log=say)
    if cfg.data is not None:
        return prepare(folder / f"data-{Path(cfg.data).name}{v}", data_dir=cfg.data, vocab_size=cfg.vocab_size,
                       log=say)
    from .common import bible_data  # noqa: PLC0415

    if cfg.corpus == "bible-en-es":
        return bible_data(folder, log, cfg.vocab_size)  # the folder the other studies share
    return prepare(folder / f"{cfg.corpus}{v}", corpus=cfg.corpus, vocab_size=cfg.vocab_size, log=say)


def base_config(cfg: Config, data) -> ModelConfig:
    """The base every row changes: SMALL_BASE (with ``base_overrides``) or the paper's base, sized to the data."""
    base = SMALL_BASE.replace(**dict(cfg.base_overrides)) if cfg.scale == "small" else TABLE3["base"].config
    return base.replace(vocab_size=data.vocab.size, pad_id=data.vocab.pad_id).checked()


def row_config(name: str, cfg: Config, data) -> ModelConfig:
    """The model row ``name`` trains: its change applied to :func:`base_config` (at full scale the ratios are
    1, so this is the paper's row, ``TABLE3[name].config``, sized to the data). A test plants a change here."""
    return TABLE3[name].applied_to(base_config(cfg, data))


def run_folder(out: Path, row: str, seed: int) -> Path:
    return Path(out) / NAME / f"{row}-seed{seed}"


def read_result(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RESULT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def finished_runs(out: Path) -> dict:
    """Every finished (row, seed) in ``OUT/table3/`` -> its result: the study's record, whichever ``--rows``
    and ``--seeds`` each start asked for (study.json holds the settings they share)."""
    found = {}
    folder = Path(out) / NAME
    for run in sorted(folder.glob("*-seed*")) if folder.is_dir() else ():
        r = read_result(run)
        if isinstance(r, dict) and r.get("row") in TABLE3 and run == run_folder(out, r["row"], r.get("seed")):
            found[(r["row"], r["seed"])] = r
    return found


def check_study_file(out: Path, current: dict) -> None:
    """Write OUT/table3/study.json on the first start; refuse (UsageError) when it holds other settings."""
    path = Path(out) / NAME / STUDY_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        saved = None
    except ValueError:
        raise UsageError(f"{path} is unreadable: delete {path.parent} or use another --out") from None
    if saved is None:
        write_json(path, current)
        return
    diff = [f"{k} {saved.get(k)!r} (now {current.get(k)!r})" for k in sorted(set(saved) | set(current))
            if saved.get(k) != current.get(k)]
    if diff:
        raise UsageError(f"{path.parent} holds table3 results of other settings ({'; '.join(diff[:3])}): use another "
                         f"--out, or delete {path.parent} to start again")


def last_train_loss(folder: Path) -> float | None:
    losses = [r["train_loss"] for r in read_jsonl(folder / METRICS) if "train_loss" in r]
    return losses[-1] if losses else None


def train_one(row: str, seed: int, cfg: Config, data, out: Path, log=print) -> dict:
    """Train and evaluate one (row, seed) into its run folder (resuming its checkpoint if it has one); -> the
    result, also written to ``result.json``. Ctrl-C / SIGTERM: the checkpoint is saved, KeyboardInterrupt."""
    s = settings(cfg)
    folder = run_folder(out, row, seed)
    if folder.exists() and not run_checkpoints(folder):
        shutil.rmtree(folder)  # a run stopped before its first checkpoint: start it again clean
    mcfg = row_config(row, cfg, data)
    device = resolve_device(cfg.device)
    model = Transformer(mcfg, seed=seed).to(xp_for(device))
    tcfg = TrainConfig(max_tokens=s["max_tokens"], accum=1, warmup=s["warmup"], lr_factor=s["lr_factor"],
                       max_steps=cfg.steps, max_minutes=cfg.minutes, save_every=0,
                       save_every_minutes=SAVE_EVERY_MINUTES, keep_last=1, average_last=1, eval_every=0,
                       log_every=cfg.log_every, seed=seed)
    trainer = Trainer(model, data, tcfg, folder, progress=False, log=lambda *a: None)
    diverged = None
    try:
        if trainer.resume():
            log(f"[{NAME}] {row} seed {seed}: resumed at step {trainer.optimizer.step_count}")
        try:
            trainer.train()
        except StopTraining as exc:  # non-finite steps: a result of this row at this learning rate
            diverged = str(exc).split(":")[0]
        if trainer.interrupted:  # Ctrl-C or SIGTERM: stop the study (the checkpoint is saved)
            log(f"[{NAME}] stopped during {row} seed {seed} at step {trainer.optimizer.step_count} (checkpoint "
                "saved): run the same command again to resume at this row")
            raise KeyboardInterrupt
        t0 = time.perf_counter()
        found = {} if diverged else evaluate(model, data, "valid", s["max_tokens"], s["dev_sentences"],
                                             DecodeOptions(beam=cfg.beam, alpha=cfg.alpha))
        eval_seconds = time.perf_counter() - t0
    finally:
        trainer.folder.close()
    result = {"row": row, "seed": seed, "config": mcfg.to_dict(), "params": int(model.num_parameters()),
              "steps": int(trainer.optimizer.step_count), "train_seconds": round(trainer.elapsed, 2),
              "eval_seconds": round(eval_seconds, 2), "seconds": round(trainer.elapsed + eval_seconds, 2),
              "train_loss": last_train_loss(folder), "dev_ppl": found.get("valid_ppl"),
              "dev_nll": found.get("valid_nll"), "dev_bleu": found.get("valid_bleu") if s["dev_sentences"] else None,
              "diverged": diverged, "device": device}
    write_json(folder / RESULT, result)
    shutil.rmtree(folder / CHECKPOINTS, ignore_errors=True)  # the numbers are the result; 3x the weights each
    return result


def measure(cfg: Config = FULL, out="runs/studies", log=print) -> dict:
    """Train every (row, seed) not yet finished in ``OUT/table3/``, one after the other; -> every result."""
    cfg.checked()
    out = Path(out)
    data = load_data(cfg, out / "data", log)
    current = {"study": NAME, **settings(cfg), "data_source": data.source,
               "vocab_sha256": vocab_fingerprint(data.vocab)}
    check_study_file(out, current)
    todo = [(row, seed) for row in cfg.rows for seed in cfg.seeds
            if read_result(run_folder(out, row, seed)) is None]
    finished = len(cfg.rows) * len(cfg.seeds) - len(todo)
    if finished:
        log(f"[{NAME}] {finished} of {len(cfg.rows) * len(cfg.seeds)} runs already finished in {out / NAME}: "
            "read back, not trained again")
    budget = Budget(NAME, len(todo), stated_minutes(cfg, len(todo)), log)
    for row, seed in todo:
        r = train_one(row, seed, cfg, data, out, log)
        budget.step(f"{row} seed {seed}: {r['steps']} steps, dev PPL {_fmt(r['dev_ppl'])}, BLEU {_fmt(r['dev_bleu'])}"
                    + (f" (diverged: {r['diverged']})" if r["diverged"] else ""))
    # The table holds every row run into this folder, not only this start's: a start with other --rows adds
    # to it (the runs' result.json are the record; study.json guarantees they share the settings).
    found = finished_runs(out)
    rows = [row for row in TABLE3 if row in cfg.rows or any(r == row for r, _ in found)]
    seeds = list(cfg.seeds) + sorted({s for _, s in found} - set(cfg.seeds))
    kept = [row for row in rows if row not in cfg.rows]
    if kept:
        log(f"[{NAME}] the table keeps rows {', '.join(kept)} run before into {out / NAME} (their result.json)")
    runs = [found[row, seed] for row in rows for seed in seeds if (row, seed) in found]
    base = base_config(cfg, data)
    return {"study": NAME, "config": asdict(cfg), "settings": settings(cfg), "data": data.source,
            "base": base.to_dict(), "base_params": count_parameters(base), "rows": rows,
            "seeds": seeds, "runs": runs, "seconds": round(sum(r["seconds"] for r in runs), 1),
            "wall_seconds": round(budget.seconds, 1)}


def stated_minutes(cfg: Config, runs: int) -> float:
    """The time the progress lines measure against: MINUTES for FULL's runs, scaled by runs and budget."""
    full_runs = len(FULL.rows) * len(FULL.seeds)
    per_run = MINUTES / full_runs
    if cfg.minutes is not None:
        return runs * (cfg.minutes + 0.2 * per_run)
    return max(runs * per_run * cfg.steps / FULL.steps, 0.1)


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# -- reading the results ----------------------------------------------------------------------------------
def summary(results: dict) -> dict:
    """Per row: params, and mean / min / max over seeds of dev PPL and dev BLEU (None without a result)."""
    out = {}
    for row in results["rows"]:
        runs = [r for r in results["runs"] if r["row"] == row]
        s = {"params": runs[0]["params"] if runs else None, "seeds": len(runs),
             "diverged": sum(bool(r.get("diverged")) for r in runs)}
        for key in ("dev_ppl", "dev_bleu"):
            vals = [r[key] for r in runs if r.get(key) is not None]
            s[key] = {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals))} if vals else None
        out[row] = s
    return out


#: What the paper says each group shows, as judged here (on dev PPL).
GROUP_CLAIMS = {"A": "one head is worse than the best head count",
                "B": "a smaller key size d_k is worse",
                "C": "bigger is better (N, d_model, d_ff each)",
                "D": "no dropout is worse; label smoothing raises PPL",
                "E": "learned positions are about equal to the sinusoids"}


def _pair(first: str, second: str, claim: str, summ: dict):
    """The comparison line of two rows' dev PPL, and (difference of the means, the larger of the two
    min..max ranges), or None when either row has no result."""
    f, s = summ.get(first, {}).get("dev_ppl"), summ.get(second, {}).get("dev_ppl")
    line = {"worse": first, "better": second, "claim": claim, "paper": [TABLE3[first].ppl, TABLE3[second].ppl]}
    if f is None or s is None:
        return {**line, "verdict": "no result", "numformer": None}, None
    diff, spread = f["mean"] - s["mean"], max(f["max"] - f["min"], s["max"] - s["min"])
    return {**line, "numformer": [f["mean"], s["mean"]], "difference": diff, "spread": spread}, (diff, spread)


def compare(worse: str, better: str, summ: dict) -> dict:
    """The paper says ``worse``'s dev PPL is above ``better``'s: "held", "reversed" or "inside the seed
    spread" (the difference of the means no larger than the larger of the two rows' min..max ranges)."""
    line, found = _pair(worse, better, f"{worse} above {better}", summ)
    if found is None:
        return line
    diff, spread = found
    return {**line, "verdict": "inside the seed spread" if abs(diff) <= spread else ("held" if diff > 0 else "reversed")}


def about_equal(row: str, base: str, summ: dict) -> dict:
    """Row E: learned positions about equal to the sinusoids: "held" when the PPL difference is inside the
    seed spread or within E_TOLERANCE of base's PPL, otherwise "differs" (by how much)."""
    line, found = _pair(row, base, f"{row} about equal to {base}", summ)
    if found is None:
        return line
    diff, spread = found
    if abs(diff) <= spread:
        verdict = "held (inside the seed spread)"
    elif abs(diff) <= E_TOLERANCE * line["numformer"][1]:
        verdict = f"held (within {100 * E_TOLERANCE:.0f}% of base)"
    else:
        verdict = f"differs ({100 * diff / line['numformer'][1]:+.1f}% PPL)"
    return {**line, "verdict": verdict}


def _value(row: str, column: str):
    """The paper's value of ``column`` in ``row`` (the order the rows of one column are compared in)."""
    return getattr(TABLE3[row].config, column)


def _falling(rows: list, summ: dict) -> list:
    """Consecutive pairs along ``rows``, each expected to have the higher PPL of the two first."""
    return [compare(a, b, summ) for a, b in zip(rows, rows[1:])]


def directions(results: dict) -> dict:
    """Per group that was run (groups without a row run are left out): the pairs of rows its direction
    compares, each with the paper's and numformer's dev PPL and a verdict."""
    summ = summary(results)
    ran = [r for r in TABLE3 if r in set(results["rows"])]
    group = lambda g: [r for r in ran if TABLE3[r].group == g]  # noqa: E731
    out = {}
    if "A-h1" in ran:  # h 1 against the best (lowest mean PPL) of base and the other A rows run
        rivals = [r for r in ["base"] + group("A") if r != "A-h1" and summ[r]["dev_ppl"] is not None]
        best = min(rivals, key=lambda r: summ[r]["dev_ppl"]["mean"]) if rivals else "base"
        out["A"] = [compare("A-h1", best, summ)]
    if group("B"):
        out["B"] = [compare(r, "base", summ) for r in group("B")]
    c = []
    for column in ("layers", "d_model", "d_ff"):  # within each column, PPL falls as the size grows
        varied = [r for r in group("C") if column in dict(TABLE3[r].changes)]
        if varied:
            c += _falling(sorted(varied + ["base"], key=lambda r: _value(r, column)), summ)
    if c:
        out["C"] = c
    d = [compare("D-drop0.0", "base", summ)] if "D-drop0.0" in ran else []
    smoothing = [r for r in ("D-ls0.2", "base", "D-ls0.0") if r in ran]  # more smoothing, higher PPL
    if len(smoothing) > 1:
        d += _falling(smoothing, summ)
    if d:
        out["D"] = d
    if "E-learned" in ran:
        out["E"] = [about_equal("E-learned", "base", summ)]
    return out


# -- integrity -------------------------------------------------------------------------------------------
#: The columns a row may change, as the built model has them (d_k / d_v: the effective per-head sizes).
EFFECTIVE = {"layers": ("layers", "n_decoder_layers"), "d_model": ("d_model",), "d_ff": ("d_ff",),
             "heads": ("heads",), "d_k": ("head_dim_k",), "d_v": ("head_dim_v",), "dropout": ("dropout",),
             "label_smoothing": ("label_smoothing",), "positional": ("positional",)}


def effective(config: dict) -> dict:
    """A model config dict as the model is built: the row columns effective (d_k -> head_dim_k, ...), every
    other field as it is."""
    cfg = ModelConfig.from_dict(config)
    out = {k: v for k, v in config.items() if k not in ("d_k", "d_v", "decoder_layers")}
    out.update({attr: getattr(cfg, attr) for attrs in EFFECTIVE.values() for attr in attrs})
    return out


def check(results: dict) -> list[str]:
    """Integrity failures only (a direction that does not hold is a result, in the table): a row whose built
    model differs from base's in other columns than the row's own (or not in each of them), a model whose
    parameters are not its config's count, two rows measured exactly alike, a (row, seed) without a result."""
    failed = []
    by = {(r["row"], r["seed"]): r for r in results["runs"]}
    for row in results["rows"]:
        for seed in results["seeds"]:
            if (row, seed) not in by:
                failed.append(f"{row} seed {seed}: no result")
    base_run = {seed: by.get(("base", seed)) for seed in results["seeds"]}
    base = effective(results["base"])
    for (row, seed), r in sorted(by.items()):
        built = effective(r["config"])
        counted = count_parameters(ModelConfig.from_dict(r["config"]))
        if counted != r["params"]:
            failed.append(f"{row} seed {seed}: the model has {r['params']} parameters, its config {counted}")
        should = {a for col, _ in TABLE3[row].changes for a in EFFECTIVE[col]}
        differ = {k for k in set(built) | set(base) if built.get(k) != base.get(k)}
        if differ != should:
            extra, same = sorted(differ - should), sorted(should - differ)
            failed.append(f"{row} seed {seed}: built unlike its row: "
                          + "; ".join(([f"{', '.join(same)} equal to base's"] if same else [])
                                      + ([f"{', '.join(extra)} differ from base's"] if extra else [])))
        b = base_run.get(seed)
        if row != "base" and b is not None and r.get("dev_ppl") is not None and r["dev_ppl"] == b.get("dev_ppl") \
                and r.get("train_loss") == b.get("train_loss"):
            failed.append(f"{row} seed {seed}: measured exactly as base (same dev PPL and training loss): "
                          "the two models were built alike")
    return failed


# -- the table and the picture ----------------------------------------------------------------------------
def _cell(s: dict | None, digits: int) -> str:
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} ({s['min']:.{digits}f}..{s['max']:.{digits}f})"


HEADER = ["row", "paper's change", "as run here", "params", "paper dev PPL", "numformer dev PPL (min..max)", "paper dev BLEU",
          "numformer dev BLEU (min..max)"]


def as_run(row: str, results: dict) -> str:
    """The row's columns as its model was built here (at small scale ``h 1, d_k 128, d_v 128`` for the
    paper's ``h 1, d_k 512, d_v 512``); ``-`` without a run."""
    config = next((r["config"] for r in results["runs"] if r["row"] == row), None)
    if config is None:
        return "-"
    built = effective(config)
    changes = [k for k, _ in TABLE3[row].changes]
    return ", ".join(f"{PAPER_COLUMNS[k]} {built[EFFECTIVE[k][0]]}" for k in changes) if changes else "base"


def table(results: dict) -> str:
    s, summ = results["settings"], summary(results)
    base = results["base"]
    budget = f"{s['steps']} steps" if s["steps"] is not None else f"{s['minutes']:g} minutes"
    shape = (f"N {base['layers']}, d_model {base['d_model']}, d_ff {base['d_ff']}, h {base['heads']}, "
             f"P_drop {base['dropout']}, eps_ls {base['label_smoothing']}, vocabulary {base['vocab_size']}")
    head = (f"# {TITLE}\n\n{CITATION}.\n\nBase ({s['scale']} scale): {shape}; {results['base_params'] / 1e6:.2f}M "
            f"parameters. Budget per run: {budget} of {s['max_tokens']} tokens, Eq. 3 x {s['lr_factor']:g}, warm-up "
            f"{s['warmup']}, no checkpoint averaging. Data: {results['data']}. Seeds: "
            f"{', '.join(map(str, results['seeds']))}. Dev PPL per word-piece over the whole valid split; dev BLEU "
            f"(sacreBLEU) of its first {s['dev_sentences']} sentences, beam {s['beam']}, alpha {s['alpha']:g}. "
            "numformer's cells: the mean over seeds (min..max). The paper's: WMT14 En-De, newstest2013.\n\n")
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in results["rows"]:
        t, r = TABLE3[row], summ[row]
        params = f"{r['params'] / 1e6:.2f}M" if r["params"] is not None else "-"
        ppl = "diverged" if r["dev_ppl"] is None and r["diverged"] else _cell(r["dev_ppl"], 2)
        bleu = _cell(r["dev_bleu"], 2)
        lines.append(f"| {row} | {t.label} | {as_run(row, results)} | {params} | {t.ppl:.2f} | {ppl} | {t.bleu:.1f} "
                     f"| {bleu} |")
    verdicts = ["", "Directions (the paper's, judged on dev PPL; \"inside the seed spread\": the difference of the "
                    "means is no larger than the larger min..max of the two rows):", ""]
    for group, pairs in directions(results).items():
        parts = []
        for p in pairs:
            ours = ("no result" if p["numformer"] is None
                    else f"numformer {p['numformer'][0]:.2f} vs {p['numformer'][1]:.2f}")
            parts.append(f"{p['claim']}: **{p['verdict']}** (paper {p['paper'][0]:.2f} vs {p['paper'][1]:.2f}; "
                         f"{ours})")
        verdicts.append(f"* {group}, {GROUP_CLAIMS[group]}: " + "; ".join(parts))
    failed = check(results)
    tail = ["", "Check (the runs are what the rows say): " + ("every row differs from base in its own columns only, "
            "every run has a result" if not failed else "FAILED: " + "; ".join(failed)),
            "", f"Measured in {results['seconds']:.0f} s (training and evaluation of every run, summed).", ""]
    return head + "\n".join(lines + verdicts + tail)


def picture(results: dict, path) -> Path:
    """Two panels, one bar pair per row but base: PPL relative to base (top), BLEU minus base's; the paper's
    beside numformer's (mean of the per-seed ratios / differences, error bars their min..max)."""
    plt = pyplot()
    rows = [r for r in results["rows"] if r != "base"]
    by = {(r["row"], r["seed"]): r for r in results["runs"]}
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.6 * len(rows) + 2), 8.5))  # one above the other
    x = np.arange(len(rows))
    for ax, key, paper_of, rel, title in (
            (axes[0], "dev_ppl", lambda t: t.ppl, lambda a, b: a / b, "dev PPL / base's dev PPL"),
            (axes[1], "dev_bleu", lambda t: t.bleu, lambda a, b: a - b, "dev BLEU - base's dev BLEU")):
        paper = [rel(paper_of(TABLE3[r]), paper_of(TABLE3["base"])) for r in rows]
        mean, lo, hi = [], [], []
        for r in rows:
            vals = [rel(by[r, s][key], by["base", s][key]) for s in results["seeds"]
                    if (r, s) in by and ("base", s) in by and by[r, s].get(key) is not None
                    and by["base", s].get(key) is not None]
            m = float(np.mean(vals)) if vals else math.nan
            mean.append(m)
            lo.append(m - min(vals) if vals else 0)
            hi.append(max(vals) - m if vals else 0)
        level = 1.0 if key == "dev_ppl" else 0.0  # the bars start at base's level: no change is no bar
        ax.bar(x - 0.2, np.subtract(paper, level), 0.4, bottom=level, color="tab:grey",
               label="paper (WMT14 En-De, 100k steps)")
        ax.bar(x + 0.2, np.subtract(mean, level), 0.4, bottom=level, yerr=[lo, hi], capsize=3, color="tab:blue",
               label="numformer (mean; seeds min..max)")
        ax.axhline(level, color="black", linewidth=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(rows, rotation=45, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    s = results["settings"]
    budget = f"{s['steps']} steps" if s["steps"] is not None else f"{s['minutes']:g} min"
    fig.suptitle(f"Vaswani et al. 2017, Table 3 on numformer\n({s['scale']} scale, {results['data']}, {budget} "
                 f"per run, seeds {', '.join(map(str, results['seeds']))})", fontsize=10)
    return save_figure(fig, path)


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Every (row, seed) into ``OUT/table3/ROW-seedS/`` (result.json, metrics.jsonl), then ``OUT/table3.png``,
    ``.md`` and ``.json`` of every row run into ``OUT``."""
    out = Path(out)
    results = measure(cfg, out, log)
    results["summary"] = summary(results)
    results["directions"] = directions(results)
    return write_outputs(out, NAME, results, check, picture, table)  # each file written beside, renamed over
