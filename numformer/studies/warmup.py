"""warmup: post-LN needs a learning-rate warm-up at a large learning rate; pre-LN does not.

Paper: Ruibin Xiong et al., "On Layer Normalization in the Transformer Architecture", ICML 2020
(arXiv:2002.04745), Section 3.2 and its Figure 2 (post-LN trained with Adam with and without warm-up,
at two large learning rates) and Section 4 (pre-LN trained without warm-up).

Claim: at a large learning rate, post-LN trained without warm-up fails to learn where the same run with
warm-up learns; pre-LN learns without warm-up. The reason they give is Theorem 1 (the ln-placement study):
post-LN's gradients near the output are large at initialisation, so a large first step there is harmful.

What numformer runs: four runs of numformer's own Trainer (Adam with the paper's betas, label smoothing
0.1, dropout 0.1), the same seed and the same batches: {post-LN, pre-LN} x {warm-up, none}. The learning
rate (:class:`PeakSchedule`): with warm-up, linear to ``peak_lr`` at step ``warmup``, then
``peak_lr * sqrt(warmup / step)`` (Eq. 3's shape); without, the same schedule with the ramp replaced by the
peak, so the two runs differ in their first ``warmup`` steps only. "Fails to learn" is measured against the
context-free floor: the lowest label-smoothed loss a model can reach without reading the source or the
earlier target tokens, the entropy of the smoothed unigram distribution of the target side (computed from
the training data). A run learns when its late loss (the mean training loss over the last quarter of the
steps) is more than ``LEARNED`` = 0.1 nats below that floor. Within 150 steps of 2,000 tokens (about 300k
tokens, a seventh of the corpus) no batch is seen twice, so the training loss is a held-out loss.

Shapes and seeds (``FULL``): the small preset (d_model 256, 4 heads, 3 + 3 layers, d_ff 1024, numformer's
default ``init="pytorch"``), bible-en-es with its 8,000-piece vocabulary, 150 steps of 2,000 tokens,
peak learning rate 2e-3 (about the small recipe's peak, 0.7 x Eq. 3 with warm-up 500: 1.96e-3), warm-up
50 steps, seed 1. ``SMALL`` (the CI's): the synthetic copy task (no corpus to build), 6 + 6 layers of width
32 (d_ff 128, 4 heads), 150 steps of 600 tokens, peak 1e-2, warm-up 30.

What numformer found: the measured late losses, the floor and the commit they were measured at are in
docs/studies.md (section warmup), not here; ``OUT/warmup.md`` is what a run of this code writes.

Where it differs: the paper's runs are IWSLT14 De-En and WMT14 over thousands of steps, reported as
validation loss and BLEU; here 150 steps on bible-en-es, where "fails to learn" means "does not get below
the context-free floor", and the model uses numformer's default initialisation. The paper's comparison of
final BLEU after full training is not repeated here.

Command: ``python -m numformer.studies warmup [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most ``MINUTES`` (10) minutes on 2 cores, what the progress lines measure against;
docs/studies.md has the measured time.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model import Transformer
from ..presets import get_preset
from ..run_file_names import CHECKPOINTS, METRICS
from ..training.config import TrainConfig
from ..training.trainer import Trainer
from .common import Budget, bible_data, markdown_table, pyplot, save_figure, write_outputs

NAME = "warmup"
TITLE = "Xiong et al. 2020, Section 3.2 / Figure 2: post-LN needs warm-up at a large learning rate, pre-LN does not"
CITATION = ("R. Xiong et al., On Layer Normalization in the Transformer Architecture, ICML 2020 "
            "(arXiv:2002.04745), Section 3.2 and Figure 2 (post-LN with and without warm-up), Section 4 "
            "(pre-LN without warm-up)")
MINUTES = 10  # stated time on 2 cores: the progress lines measure against it

#: The placements compared, by name -> ModelConfig.pre_norm (a test plants a change here).
PRE_NORM = {"post-LN": False, "pre-LN": True}

# The qualitative finding (checked by check()): a run learns when its late loss is more than LEARNED nats
# below the context-free floor; post-LN without warm-up must not, the three others must. The measured runs
# of FULL and SMALL clear it with margin either way (docs/studies.md, warmup, has their figures).
LEARNED = 0.1


@dataclass(frozen=True)
class Config:
    preset: str = "small"
    overrides: tuple = ()
    corpus: str = "bible-en-es"          # or task "copy" (synthetic)
    vocab_size: int | None = None        # None: the corpus's default (8,000 pieces for bible-en-es)
    steps: int = 150
    max_tokens: int = 2000
    peak_lr: float = 2e-3
    warmup: int = 50
    seed: int = 1
    log_every: int = 5
    placements: tuple = ("post-LN", "pre-LN")   # keys of PRE_NORM to run


FULL = Config()
#: The CI's: the synthetic copy task (no corpus to build), 6 + 6 layers of width 32, 150 steps of 600 tokens.
SMALL = Config(preset="tiny", overrides=(("d_model", 32), ("d_ff", 128), ("layers", 6)), corpus="copy", steps=150,
               max_tokens=600, peak_lr=1e-2, warmup=30, log_every=5)


class PeakSchedule:
    """The study's learning rate: ``peak * min(step / warmup, sqrt(warmup / step))`` with warm-up (Eq. 3's
    shape, peaking at step ``warmup``), ``peak * min(1, sqrt(warmup / step))`` without: the same schedule
    with the ramp replaced by the peak, so the two runs differ in their first ``warmup`` steps only."""

    def __init__(self, peak: float, warmup: int, warm: bool):
        self.peak, self.warmup, self.warm = peak, warmup, warm

    def __call__(self, step: int) -> float:
        step = max(int(step), 1)
        decay = min(1.0, (self.warmup / step) ** 0.5)
        return self.peak * (min(step / self.warmup, decay) if self.warm else decay)


def load_data(cfg: Config, folder: Path, log=print):
    if cfg.corpus == "copy":
        from ..data.prepared_dataset import prepare  # noqa: PLC0415

        return prepare(folder / "copy", task="copy", seed=cfg.seed, log=lambda line: log(f"data: {line}"))
    return bible_data(folder, log, cfg.vocab_size)


def context_free_floor(data, eps: float) -> dict:
    """The lowest losses a model that ignores its inputs can reach on the training targets (EOS included):
    ``nll`` = the entropy of the target unigram distribution u; ``loss`` = the label-smoothed loss's
    minimum, the entropy of ``(1 - eps) u + eps / V`` (the smoothed target averaged over tokens)."""
    pairs, v = data.ids["train"], data.vocab
    ids = np.asarray(pairs.tgt_ids)
    counts = np.bincount(ids, minlength=v.size).astype(np.float64)
    counts[v.eos_id] += len(pairs)  # every target ends with EOS
    u = counts / counts.sum()
    q = (1 - eps) * u + eps / v.size
    with np.errstate(divide="ignore", invalid="ignore"):
        nll = -np.sum(np.where(u > 0, u * np.log(u), 0.0))
    return {"nll": float(nll), "loss": float(-np.sum(q * np.log(q)))}


def run_name(placement: str, warm: bool, cfg: Config) -> str:
    return f"{placement}-" + (f"warmup{cfg.warmup}" if warm else "nowarmup")


def measure(cfg: Config = FULL, out="runs/studies", log=print) -> dict:
    out = Path(out)
    data = load_data(cfg, out / "data", log)
    runs = {}
    budget = Budget(NAME, 2 * len(cfg.placements), MINUTES, log)
    for placement in cfg.placements:
        pre_norm = PRE_NORM[placement]
        for warm in (True, False):
            name = run_name(placement, warm, cfg)
            folder = out / NAME / name
            if folder.exists():
                shutil.rmtree(folder)  # a fresh run each time (the study owns this folder)
            mcfg = get_preset(cfg.preset, **dict(cfg.overrides), vocab_size=data.vocab.size, pad_id=data.vocab.pad_id,
                              pre_norm=pre_norm)
            tcfg = TrainConfig(max_tokens=cfg.max_tokens, accum=1, max_steps=cfg.steps, save_every=0, keep_last=1,
                               average_last=1, eval_every=0, log_every=cfg.log_every, seed=cfg.seed)
            trainer = Trainer(Transformer(mcfg, seed=cfg.seed), data, tcfg, folder, progress=False, log=lambda *a: None)
            # the study's schedule instead of Eq. 3 (the trainer's metrics and Adam both read it from here)
            trainer.schedule = trainer.optimizer.schedule = PeakSchedule(cfg.peak_lr, cfg.warmup, warm)
            trainer.train()
            if trainer.interrupted:  # Ctrl-C or SIGTERM ended the run: stop the study, not just this run
                raise KeyboardInterrupt
            shutil.rmtree(folder / CHECKPOINTS, ignore_errors=True)  # the curves are the result, not the weights
            lines = [json.loads(x) for x in (folder / METRICS).read_text().splitlines() if x.strip()]
            rows = [r for r in lines if "train_loss" in r]
            runs[name] = {"placement": placement, "warmup": cfg.warmup if warm else 0,
                          "step": [r["step"] for r in rows], "train_loss": [r["train_loss"] for r in rows],
                          "lr": [r["lr"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows],
                          "skipped_steps": max([r.get("skipped_steps", 0) for r in lines] or [0]),
                          "folder": str(folder)}
            budget.step(name)
    floor = context_free_floor(data, get_preset(cfg.preset).label_smoothing)
    return {"study": NAME, "config": dict(cfg.__dict__, overrides=dict(cfg.overrides)), "floor": floor,
            "runs": runs, "seconds": round(budget.seconds, 1)}


def late_loss(run: dict) -> float:
    """Mean training loss over the last quarter of the logged steps (each line averages its steps)."""
    losses = run["train_loss"]
    return float(np.mean(losses[-max(1, len(losses) // 4):]))


def findings(results: dict) -> list[dict]:
    floor = results["floor"]["loss"]
    rows = []
    for name, r in results["runs"].items():
        late = late_loss(r)
        rows.append({"run": name, "placement": r["placement"], "warmup": r["warmup"], "late_loss": late,
                     "below_floor": floor - late, "peak_grad_norm": float(max(r["grad_norm"])),
                     "learns": floor - late > LEARNED})
    return rows


def expectation(row: dict) -> str:
    if row["placement"] == "post-LN" and not row["warmup"]:
        return "fails to learn"
    return "learns"


def check(results: dict) -> list[str]:
    """post-LN without warm-up does not get more than LEARNED below the floor; the three other runs do.
    Returns what fails (empty: the finding holds)."""
    failed = []
    for r in findings(results):
        gap = r["below_floor"]
        if expectation(r) == "fails to learn" and r["learns"]:
            failed.append(f"{r['run']}: {gap:.2f} below the floor, expected less than {LEARNED} (no learning)")
        elif expectation(r) == "learns" and not r["learns"]:
            failed.append(f"{r['run']}: {gap:.2f} below the floor, expected more than {LEARNED} (learning)")
    return failed


def table(results: dict) -> str:
    c, floor = results["config"], results["floor"]
    rows = [[r["run"], r["placement"], r["warmup"] or "none", r["late_loss"], r["below_floor"], r["peak_grad_norm"],
             "learns" if r["learns"] else "does not learn", expectation(r)] for r in findings(results)]
    head = (f"# {TITLE}\n\n{CITATION}.\n\n{c['preset']} preset {dict(c['overrides']) or ''}, {c['corpus']}, "
            f"{c['steps']} steps of {c['max_tokens']} tokens, peak learning rate {c['peak_lr']:g}, seed {c['seed']}. "
            f"Context-free floor (entropy of the smoothed target unigram distribution): {floor['loss']:.3f} "
            f"(NLL {floor['nll']:.3f}). late loss = mean training loss over the last quarter of the steps.\n\n")
    failed = check(results)
    tail = ("\nCheck: " + (f"the finding holds (post-LN without warm-up less than {LEARNED} below the floor, "
                           f"the others more than {LEARNED} below it)" if not failed
                           else "FAILED: " + "; ".join(failed)) + f"\n\nMeasured in {results['seconds']:.0f} s.\n")
    return head + markdown_table(["run", "placement", "warm-up", "late loss", "below floor", "peak grad norm",
                                  "numformer", "paper"], rows) + tail


def picture(results: dict, path) -> Path:
    """The four runs in one picture: training loss (with the context-free floor), learning rate, gradient norm."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    style = {("post-LN", True): ("tab:red", "-"), ("post-LN", False): ("tab:red", "--"),
             ("pre-LN", True): ("tab:blue", "-"), ("pre-LN", False): ("tab:blue", "--")}
    for name, r in results["runs"].items():
        colour, line = style.get((r["placement"], bool(r["warmup"])), (None, "-"))
        for ax, key in zip(axes, ("train_loss", "lr", "grad_norm")):
            ax.plot(r["step"], r[key], color=colour, linestyle=line, label=name)
    axes[0].axhline(results["floor"]["loss"], color="grey", linestyle=":", label="context-free floor")
    axes[0].set_title("training loss (label-smoothed, unseen batches)")
    axes[1].set_title("learning rate")
    axes[2].set_title("global gradient norm")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    c = results["config"]
    fig.suptitle(f"Xiong et al. 2020: warm-up, post-LN vs pre-LN (numformer, {c['preset']}, {c['corpus']}, "
                 f"peak lr {c['peak_lr']:g})", fontsize=11)
    return save_figure(fig, path)


def run(out, cfg: Config = FULL, log=print) -> dict:
    """The four runs into ``OUT/warmup/RUN/`` (metrics.jsonl each), then ``OUT/warmup.png``, ``.md``, ``.json``."""
    out = Path(out)
    results = measure(cfg, out, log)
    return write_outputs(out, NAME, results, check, picture, table)
