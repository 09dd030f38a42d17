"""noise-scale: the gradient noise scale of each layer type against the whole model's, over training.

Paper: Gavia Gray, Aman Tiwari, Shane Bergsma, Joel Hestness, "Normalization Layer Per-Example Gradients
are Sufficient to Predict Gradient Noise Scale in Transformers", NeurIPS 2024 (arXiv:2411.00999).

Claim: the simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018) can be
measured per layer type from per-example gradient norms; over training, the LayerNorm layers' noise scale
tracks the total noise scale of the model, so that the normalisation layers' per-example gradients
(cheap: a few vectors per layer) suffice to predict the total. Their models are decoder-only (GPT-2
style, pre-LN).

What numformer measures: an encoder-decoder trained on bible-en-es (numformer's own Adam with Eq. 3's
warm-up, label smoothing 0.1, dropout 0.1), post-LN (the paper's Transformer) and pre-LN (Gray et al.'s),
the same seed, weights and batches for both. Every ``log_every`` steps the squared norm of every
sentence's gradient of every tensor is taken exactly from the hand-written backward
(numformer/training/per_sentence_gradients.py) and reduced to the unbiased ``|G|^2`` and ``tr(Sigma)`` of each
group (numformer/training/gradient_noise_scale.py); as in McCandlish et al. and Gray et al., both are smoothed by an
exponential moving average (``ema``) before their ratio is taken. Groups: the four layer types (attention,
feed-forward, LayerNorm, embedding) and the total, and, what a decoder-only model does not have, the
encoder's and the decoder's LayerNorms, self-attention of either stack and the encoder-decoder
(cross-) attention apart. For each group: the Pearson correlation of ``log B_group`` with
``log B_total`` over the logged steps after warm-up, and the median ratio ``B_group / B_total``.

Shapes and seeds (``FULL``): d_model 128, 3 + 3 layers, 4 heads, d_ff 512, bible-en-es's 8,000-piece
vocabulary, tied embeddings, batches of 64 sentence pairs (each side at most 48 subwords, about 2,000
target tokens), 400 steps, warm-up 100, learning-rate factor 1.0, per-sentence norms every 10 steps, EMA
0.8; seed 1.

What numformer found: the measured correlations, ratios and noise scales, the spread of ``SMALL`` over seeds
and the commits they were measured at are in docs/studies.md (section noise-scale), not here;
``OUT/noise-scale.md`` is what a run of this code writes.

Where it differs: Gray et al.'s models are decoder-only GPT-2-style pre-LN language models, larger and
trained far longer; here an encoder-decoder translation model in both placements, one seed, one corpus,
400 steps for ``FULL``. The groups a decoder-only model lacks (the encoder's, cross-attention) are measured
besides the paper's four layer types.

Command: ``python -m numformer.studies noise-scale [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most ``MINUTES`` (10) minutes on 2 cores, what the progress lines measure against;
docs/studies.md has the measured time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..model import Transformer
from ..presets import get_preset
from ..training.gradient_noise_scale import GROUPS, NoiseEstimate, noise_scales, summed_by
from ..training.per_sentence_gradients import PerSentenceGradients
from .common import (Budget, adam_steps, bible_data, markdown_table, pyplot, random_batch, save_figure, sentence_batch,
                     write_outputs)

NAME = "noise-scale"
TITLE = ("Gray et al. 2024: each layer type's gradient noise scale against the total over training, "
         "post-LN vs pre-LN, encoder-decoder")
CITATION = ("G. Gray, A. Tiwari, S. Bergsma, J. Hestness, Normalization Layer Per-Example Gradients are "
            "Sufficient to Predict Gradient Noise Scale in Transformers, NeurIPS 2024 (arXiv:2411.00999)")
MINUTES = 10  # stated time on 2 cores

#: The placements compared, by name -> ModelConfig.pre_norm (a test plants a change here).
PRE_NORM = {"post-LN": False, "pre-LN": True}

# The claim as bounds (check()): LayerNorm's noise scale tracks the total's in both placements.
# FULL's measured figures and SMALL's (at its seed) clear both with margin: docs/studies.md, noise-scale, has
# them, and SMALL's spread over seeds.
TRACK_MIN = 0.8       # Pearson correlation of log B_layernorm with log B_total after warm-up
RATIO_BAND = (0.2, 5.0)  # median B_layernorm / B_total


@dataclass(frozen=True)
class Config:
    """The model shape (a preset with overrides), the data, the training and the logging."""

    preset: str = "small"
    overrides: tuple = (("d_model", 128), ("d_ff", 512), ("heads", 4), ("layers", 3))
    data: str = "sentences"          # or "copy": random tokens to copy (the CI's: no corpus to build)
    vocab_size: int = 1000           # "copy" only
    sentences: int = 64
    max_len: int = 48
    length: int = 12                 # "copy": tokens per sentence
    steps: int = 400
    warmup: int = 100
    lr_factor: float = 1.0
    log_every: int = 10
    ema: float = 0.8
    seed: int = 1
    dtype: str = "float32"           # the CI's runs in float64: its outcome must not ride on the CPU's rounding


FULL = Config()
#: The CI's configuration: a tiny model learning to copy random tokens, seconds on 2 cores, in float64 and with
#: a seed whose outcome is the same under every CPU configuration of tests/cpu_matrix.py: its pre-LN run is
#: chaotic, so that a rounding difference (float32, FMA or not) can change another seed's outcome
#: (docs/studies.md, noise-scale, has the spread over seeds 1-6 and CPUs).
SMALL = Config(overrides=(("d_model", 32), ("d_ff", 64), ("heads", 2), ("layers", 2)), data="copy", vocab_size=40,
               sentences=16, length=8, steps=240, warmup=40, lr_factor=2.0, log_every=5, seed=6, dtype="float64")


def subgroup_of(name: str) -> str | None:
    """The stack-aware groups a decoder-only model lacks: the encoder's and decoder's LayerNorms, each stack's
    self-attention and the encoder-decoder attention (None for the other tensors)."""
    stack = "encoder" if name.startswith("encoder.") else "decoder" if name.startswith("decoder.") else None
    if stack is None:
        return None
    if "cross_attn." in name:
        return "cross-attention"
    if "self_attn." in name:
        return f"{stack} self-attention"
    if "norm." in name:
        return f"{stack} LayerNorm"
    return None


def copy_batch(rng, cfg: Config):
    """Random ordinary tokens to copy: (src, tgt_in, tgt_out) with tgt = src."""
    src, _, _ = random_batch(rng, cfg.sentences, cfg.length, cfg.vocab_size)
    tgt_in = np.concatenate([np.full((cfg.sentences, 1), 2, dtype=np.int64), src[:, :-1]], axis=1)
    return src, tgt_in, src


def grouped(noise: dict) -> dict:
    """{group: (|G|^2, tr(Sigma))}: the layer types, the total and the stack-aware groups of one step."""
    out = {g: (e.grad_sq, e.trace) for g, e in noise["groups"].items()}
    out["total"] = (noise["total"].grad_sq, noise["total"].trace)
    out.update({k: (e.grad_sq, e.trace) for k, e in summed_by(noise["tensors"], subgroup_of).items()})
    return out


def train_one(cfg: Config, pre_norm: bool, vocab_size: int, batches, budget, placement: str) -> dict:
    """Train one placement on ``batches`` (one per step), logging every group's |G|^2 and tr(Sigma)."""
    mcfg = get_preset(cfg.preset, **dict(cfg.overrides), vocab_size=vocab_size, pre_norm=pre_norm)
    model = Transformer(mcfg, seed=cfg.seed, dtype=np.dtype(cfg.dtype))
    log, losses = {}, []

    def watch(step):  # every log_every-th step: every sentence's gradient norms, through the layers' taps
        return PerSentenceGradients(model, elementwise=False) if step % cfg.log_every == 0 else None

    def after(step, loss, tap):
        if tap is not None:
            for group, (g2, trace) in grouped(noise_scales(tap.statistics())).items():
                log.setdefault(group, []).append((step, g2, trace))
            losses.append((step, float(to_host(loss))))
            budget.step(f"{placement} step {step}", weight=cfg.log_every)
    adam_steps(model, batches[:cfg.steps], cfg.warmup, cfg.lr_factor, watch, after, overwrite_logits=True)
    return {"groups": log, "loss": losses}


def measure(cfg: Config = FULL, data_dir=None, log=print) -> dict:
    """Train both placements on the same batches; every group's estimates per logged step (JSON-able)."""
    rng = np.random.default_rng(cfg.seed)
    if cfg.data == "copy":
        vocab_size = cfg.vocab_size
        batches = [copy_batch(rng, cfg) for _ in range(cfg.steps)]
    else:
        data = bible_data(Path(data_dir or "runs/studies/data"), log)
        vocab_size = data.vocab.size
        batches = [sentence_batch(data, rng, cfg.sentences, cfg.max_len) for _ in range(cfg.steps)]
    budget = Budget(NAME, len(PRE_NORM) * cfg.steps, MINUTES, log)
    runs = {p: train_one(cfg, pre, vocab_size, batches, budget, p) for p, pre in PRE_NORM.items()}
    return {"study": NAME, "config": {**cfg.__dict__, "overrides": dict(cfg.overrides)}, "vocab_size": vocab_size,
            "sentences": cfg.sentences, "runs": runs, "seconds": round(budget.seconds, 1)}


def smoothed(series, ema: float) -> tuple:
    """(steps, B_simple) from (step, |G|^2, tr(Sigma)) rows: both terms smoothed by an EMA, then divided
    (nan where the smoothed |G|^2 is not positive)."""
    steps, out, g2s, trs = [], [], None, None
    for step, g2, tr in series:
        g2s = g2 if g2s is None else ema * g2s + (1 - ema) * g2
        trs = tr if trs is None else ema * trs + (1 - ema) * tr
        steps.append(step)
        out.append(NoiseEstimate(g2s, trs, 2).b_simple)
    return np.array(steps), np.array(out, dtype=float)


def findings(results: dict) -> list[dict]:
    """Per placement and group: correlation of log B_group with log B_total after warm-up, median ratio,
    and the last smoothed value."""
    cfg = results["config"]
    rows = []
    for placement, run in results["runs"].items():
        steps, total = smoothed(run["groups"]["total"], cfg["ema"])
        after = steps > cfg["warmup"]
        for group, series in run["groups"].items():
            if group == "total":
                continue
            _, b = smoothed(series, cfg["ema"])
            ok = after & np.isfinite(b) & np.isfinite(total) & (b > 0) & (total > 0)
            corr = float(np.corrcoef(np.log(b[ok]), np.log(total[ok]))[0, 1]) if ok.sum() >= 3 else float("nan")
            rows.append({"placement": placement, "group": group, "kind": "type" if group in GROUPS else "stack",
                         "correlation": corr, "median_ratio": float(np.median(b[ok] / total[ok])) if ok.any()
                         else float("nan"), "last": float(b[-1]), "last_total": float(total[-1])})
    return rows


def check(results: dict) -> list[str]:
    """Gray et al.'s finding as bounds: in every placement LayerNorm's B_simple correlates with the total's
    (log-log, after warm-up) above TRACK_MIN, with a median ratio within RATIO_BAND."""
    failed = []
    for r in findings(results):
        if r["group"] != "layernorm":
            continue
        if not r["correlation"] > TRACK_MIN:
            failed.append(f"{r['placement']}: LayerNorm's noise scale correlates {r['correlation']:.2f} with the "
                          f"total's, expected above {TRACK_MIN}")
        if not RATIO_BAND[0] < r["median_ratio"] < RATIO_BAND[1]:
            failed.append(f"{r['placement']}: LayerNorm's noise scale is {r['median_ratio']:.2f}x the total's, "
                          f"expected within {RATIO_BAND}")
    return failed


def table(results: dict) -> str:
    cfg = results["config"]
    rows = [[r["placement"], r["group"], r["correlation"], r["median_ratio"], r["last"], r["last_total"],
             "tracks the total (LayerNorm)" if r["group"] == "layernorm" else
             ("no claim (decoder-only models have no such group)" if r["kind"] == "stack" else "no claim")]
            for r in findings(results)]
    head = (f"# {TITLE}\n\n{CITATION}.\n\nB_simple = tr(Sigma) / |G|^2 per group from every sentence's gradient "
            f"norm (batches of {results['sentences']} sentences), |G|^2 and tr(Sigma) smoothed by an EMA of "
            f"{cfg['ema']} over the steps logged every {cfg['log_every']}; correlation = Pearson of log B_group with "
            f"log B_total after warm-up (step > {cfg['warmup']}); ratio = median B_group / B_total.\n\n")
    failed = check(results)
    tail = ("\nCheck: " + (f"the finding holds (LayerNorm correlation > {TRACK_MIN}, ratio within {RATIO_BAND})"
                           if not failed else "FAILED: " + "; ".join(failed)))
    tail += f"\n\nMeasured in {results['seconds']:.0f} s.\n"
    return head + markdown_table(["placement", "group", "correlation with total", "median ratio to total",
                                  "last B_simple", "last B_total", "paper"], rows) + tail


def picture(results: dict, path) -> Path:
    """Per placement: the layer types' and the total's B_simple over training (left), the stack-aware
    groups' (right)."""
    plt = pyplot()
    cfg = results["config"]
    runs = results["runs"]
    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 4.2 * len(runs)), squeeze=False)
    for r, (placement, run) in enumerate(runs.items()):
        for c, kinds in enumerate((list(GROUPS), [g for g in run["groups"] if g not in GROUPS and g != "total"])):
            ax = axes[r, c]
            for group in kinds + ["total"]:
                if group not in run["groups"]:
                    continue
                steps, b = smoothed(run["groups"][group], cfg["ema"])
                style = dict(color="black", linewidth=2.2) if group == "total" else {}
                ax.plot(steps, b, label=group, **style)
            ax.axvline(cfg["warmup"], color="grey", linestyle=":", linewidth=1)
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_ylabel("B_simple (sentences)")
            ax.set_title(f"{placement}: " + ("layer types" if c == 0 else "encoder / decoder / cross-attention"),
                         fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Gray et al. 2024: per-group gradient noise scale against the total (numformer, encoder-decoder)",
                 fontsize=10)
    return save_figure(fig, path)


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Measure, then write ``OUT/noise-scale.png``, ``.md`` and ``.json``."""
    out = Path(out)
    results = measure(cfg, out / "data", log)
    return write_outputs(out, NAME, results, check, picture, table)
