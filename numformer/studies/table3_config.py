"""table3's configuration: which rows of Table 3 (Vaswani et al. 2017, Section 6.2) run, at which scale, on
which data and budget, and the model each row trains.

At ``--scale small`` every row applies the paper's relative change (:meth:`numformer.presets.Table3Row.applied_to`)
to :data:`SMALL_BASE`: N 3, d_model 128, d_ff 512, h 8 (d_k = d_v = 16), P_drop 0.1, eps_ls 0.1. Eight heads, as
the paper's base, so that each row A ratio (h 1, 4, 16, 32 of 8) is a whole number of heads with d_k = d_v =
128, 32, 8, 4 (the computation constant, as in the paper); 3 layers, half the paper's 6, so that row C's N 2 /
4 / 8 become 1 / 2 / 4 layers; d_model 128 so that ``FULL``'s 20 trainings fit the stated hour on 2 cores.
Row B keeps d_v 16 (the paper's blank d_v column keeps base's 64). At ``--scale full`` every row is the
paper's own shape (``TABLE3[row].config``: N 6, d_model 512, d_ff 2048, h 8), sized to the data's vocabulary.

:func:`settings` resolves the Nones of :class:`Config` into what every run's result depends on; the schedule
is Eq. 3 (Section 5.3, each row's own d_model) with a warm-up of a fifth of the step budget, times
``lr_factor``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..decoding.search import PAPER_ALPHA, PAPER_BEAM
from ..errors import UsageError
from ..presets import TABLE3, ModelConfig

NAME = "table3"
TITLE = "Vaswani et al. 2017, Table 3: variations on the base Transformer, each row against base"
CITATION = ("A. Vaswani et al., Attention Is All You Need, NeurIPS 2017 (arXiv:1706.03762), Section 6.2 and "
            "Table 3 (variations on the Transformer architecture, En-De newstest2013 dev)")
MINUTES = 60  # the stated time of FULL on 2 cores: the progress lines measure against it

#: The CPU-sized base every row's relative change is applied to at ``--scale small`` (the docstring says why).
SMALL_BASE = ModelConfig(d_model=128, d_ff=512, heads=8, layers=3, dropout=0.1, label_smoothing=0.1)
#: The groups of Table 3, in the paper's order (``big`` is a row of its own; it has no direction here).
GROUPS = ("A", "B", "C", "D", "E")
SCALES = ("small", "full")
#: Defaults of the settings that depend on the scale (None in :class:`Config`). lr_factor 0.25 at small scale
#: was chosen on base at 600 steps (docs/studies.md, table3, has the sweep); full is GPU_RECIPES["base"].
SCALE_DEFAULTS = {"small": {"max_tokens": 2000, "lr_factor": 0.25, "minutes_warmup": 120},
                  "full": {"max_tokens": 12500, "lr_factor": 1.0, "minutes_warmup": 1000}}
#: A run writes a checkpoint this often (minutes of training) besides at its end: what a killed run loses.
SAVE_EVERY_MINUTES = 5


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


#: Rows A, D and E with base, 1,000 steps of 2,000 tokens each, seeds 1 and 2, bible-en-es: 20 trainings.
FULL = Config()
#: The CI's: two rows on a base of width 32, the copy task (no corpus to build), 30 steps, two seeds.
SMALL = Config(rows=("base", "A-h1"), steps=30, corpus=None, task="copy", max_tokens=600, lr_factor=1.0,
               warmup=10, dev_sentences=10, base_overrides=(("d_model", 32), ("d_ff", 128), ("layers", 2)),
               log_every=5)


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


def base_config(cfg: Config, data) -> ModelConfig:
    """The base every row changes: SMALL_BASE (with ``base_overrides``) or the paper's base, sized to the data."""
    base = SMALL_BASE.replace(**dict(cfg.base_overrides)) if cfg.scale == "small" else TABLE3["base"].config
    return base.replace(vocab_size=data.vocab.size, pad_id=data.vocab.pad_id).checked()


def row_config(name: str, cfg: Config, data) -> ModelConfig:
    """The model row ``name`` trains: its change applied to :func:`base_config` (at full scale the ratios are
    1, so this is the paper's row, ``TABLE3[name].config``, sized to the data)."""
    return TABLE3[name].applied_to(base_config(cfg, data))


def stated_minutes(cfg: Config, runs: int) -> float:
    """The time the progress lines measure against: MINUTES for FULL's runs, scaled by runs and budget."""
    full_runs = len(FULL.rows) * len(FULL.seeds)
    per_run = MINUTES / full_runs
    if cfg.minutes is not None:
        return runs * (cfg.minutes + 0.2 * per_run)
    return max(runs * per_run * cfg.steps / FULL.steps, 0.1)
