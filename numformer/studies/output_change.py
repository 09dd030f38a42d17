"""output-change: how much one update moves the output of a post-LN and of a pre-LN Transformer, by depth.

Paper: Liyuan Liu, Xiaodong Liu, Jianfeng Gao, Weizhu Chen, Jiawei Han, "Understanding the Difficulty of
Training Transformers", EMNLP 2020 (arXiv:2004.08249), Section 4 ("amplification effect"): its analysis and
the figure of the output change ``|F(x0, W) - F(x0, W*)|^2`` against the number of layers (the repository
of the paper shows it as ``output_change.png``; its figure number was not checked here).

Claim: a post-LN layer depends heavily on its residual branch, so a parameter update ``W -> W*`` of a
given size changes the output of an N-layer post-LN Transformer by ``O(N)``, of a pre-LN one by
``O(log N)``: post-LN amplifies small updates with depth, which makes its early training unstable (and
is why it needs warm-up).

What numformer measures: for N + N layers (N encoder and N decoder layers), both placements and both
initialisations, every parameter but the tied embedding (so the input ``x0`` stays fixed) is moved by
about ``lr``, in two ways (below), and the output ``F`` is compared before and after: ``F`` is the
decoder's final hidden state (the input of the output projection, after the final LayerNorm in pre-LN),
the change is the ``mean over target tokens of ||F(x0, W*) - F(x0, W)||^2 / d_model``.

Shapes and seeds (``FULL``): the small preset's width (d_model 256, d_ff 1024, 4 heads), N in 1, 2, 4, 6,
9, 12, vocabulary 8,000 (bible-en-es), dropout 0, float32, ``lr`` 1e-5 (the random update's ratios
were the same at 1e-4 and 1e-6); seeds 1, 2, 3 (weights, batch, random signs), one batch of
16 training pairs of at most 64 subwords a side per seed. Two updates: ``random`` (independent random signs,
the setting of the paper's analysis, where every layer's change is independent of the others') and
``adam`` (the first step of numformer's Adam on the training loss of the batch: about ``-lr sign(g)``
for every parameter, whatever the size of its gradient; the update training makes).

What numformer found: the fitted exponents of ``change ~ N^p``, the ratios between the placements and where
the measurement departs from the paper are in docs/studies.md (section output-change), not here;
``OUT/output-change.md`` is what a run of this code writes.

Where it differs: the paper's models are trained on WMT'14/IWSLT'14 at up to 18 layers; here one update
from initialisation on bible-en-es, up to 12 layers, with independent random signs and with Adam's first step.

Command: ``python -m numformer.studies output-change [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most 8 minutes on 2 cores (the measured time: docs/studies.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..model import Transformer
from ..optim import Adam
from ..presets import get_preset
from .common import (Budget, bible_data, gradient_at, markdown_table, pyplot, random_batch, sentence_batch,
                     save_figure, write_outputs)

NAME = "output-change"
TITLE = ("Liu et al. 2020, Section 4 / output-change figure: the output change of one update against "
         "depth, post-LN O(N) vs pre-LN O(log N)")
CITATION = ("L. Liu, X. Liu, J. Gao, W. Chen, J. Han, Understanding the Difficulty of Training Transformers, "
            "EMNLP 2020 (arXiv:2004.08249), Section 4 (amplification effect), the output change "
            "|F(x0,W) - F(x0,W*)|^2 against the number of layers")
MINUTES = 8  # stated time on 2 cores (measured 1.8 min; see the docstring)

#: The placements compared, by name -> ModelConfig.pre_norm (a test plants a change here).
PRE_NORM = {"post-LN": False, "pre-LN": True}

# The qualitative finding as bounds (xavier; checked by check()), p = the exponent of change ~ N^p:
POST_EXPONENT_MIN = 0.8    # random update: post-LN grows about linearly (O(N): p = 1; measured 1.06 FULL, 1.31 SMALL)
EXPONENT_GAP_MIN = 0.2     # random update: post-LN's p exceeds pre-LN's by this (measured 0.37 FULL, 0.44 SMALL)
POST_OVER_PRE_MIN = 1.5    # both updates: post-LN's change over pre-LN's at the deepest N (measured 5.1 / 2.4 and up)


@dataclass(frozen=True)
class Config:
    """Model width (a preset with overrides), depths, initialisations, seeds, batch, learning rate."""

    preset: str = "base"
    overrides: tuple = ()
    depths: tuple = (1, 2, 4, 6, 9, 12)
    inits: tuple = ("xavier", "pytorch")
    data: str = "sentences"            # or "random" (no corpus needed; the CI's configuration)
    vocab_size: int = 8000             # random tokens only
    seeds: tuple = (1, 2, 3)
    sentences: int = 16
    length: int = 30                   # random tokens per sentence
    max_len: int = 64
    updates: tuple = ("random", "adam")
    lr: float = 1e-5


FULL = Config(preset="small", depths=(1, 2, 4, 6, 9, 12))
SMALL = Config(preset="small", overrides=(("d_model", 64), ("d_ff", 256), ("heads", 4)), depths=(1, 2, 4, 8),
               inits=("xavier",), data="random", vocab_size=500, seeds=(1, 2), sentences=8, length=12)


def decoder_output(model, batch):
    """F(x0, W): the decoder's final hidden state (B, T, d_model) on ``batch``, a host float64 array, and the
    target mask (B, T) of real tokens. Read as the output projection's input, by a forward tap on it."""
    src, tgt_in, _ = batch
    xp = model.xp
    seen = []

    def read_input(projection, forward, h):
        seen.append(h)
        return forward(h)
    model.train()  # dropout is 0: the same forward as the training step's
    with model.generator.tap(forward=read_input):
        model(xp.asarray(src), xp.asarray(tgt_in))
    model.clear_cache()  # no backward follows: what the layers saved for one goes
    return np.asarray(to_host(seen[0]), dtype=np.float64), np.asarray(tgt_in) != model.cfg.pad_id


def output_change(model, batch, lr: float, update: str = "adam", seed: int = 0) -> dict:
    """Move every parameter but the tied embedding by about ``lr`` and measure how far the output moves.

    ``update="adam"``: one step of numformer's Adam (the first step is ``-lr * g / (|g| + eps)``, about
    ``-lr sign(g)``: every layer's change points down the loss's gradient, so the layers' effects add up).
    ``update="random"``: ``lr`` times independent random signs (the theorem's setting: every layer's change
    independent of the others'). -> the mean squared change of the decoder output per token and feature,
    and the mean squared output itself (for scale)."""
    before, mask = decoder_output(model, batch)
    embedding = model.src_embed.weight
    params = [p for p in model.parameters() if p is not embedding]
    if update == "adam":
        gradient_at(model, batch)
        Adam(params, lr=lr).step(zero_grad=True)
    else:
        rng = np.random.default_rng(seed)
        for p in params:
            signs = rng.integers(0, 2, size=p.data.shape).astype(p.data.dtype) * 2 - 1
            p.data += model.xp.asarray(lr * signs, dtype=p.data.dtype)
    after, _ = decoder_output(model, batch)
    d = before.shape[-1]
    diff = ((after - before) ** 2).sum(-1)[mask] / d
    return {"change": float(diff.mean()), "output_sq": float(((before ** 2).sum(-1)[mask] / d).mean())}


def measure(cfg: Config = FULL, data_dir=None, log=print) -> dict:
    data = bible_data(Path(data_dir or "runs/studies/data"), log) if cfg.data == "sentences" else None
    vocab_size = data.vocab.size if data is not None else cfg.vocab_size
    batches = {}
    for seed in cfg.seeds:
        rng = np.random.default_rng(seed)
        batches[seed] = (sentence_batch(data, rng, cfg.sentences, cfg.max_len) if data is not None
                         else random_batch(rng, cfg.sentences, cfg.length, vocab_size))
    # work ~ the number of layers built and run
    budget = Budget(NAME, len(cfg.inits) * len(PRE_NORM) * sum(cfg.depths) * len(cfg.seeds), MINUTES, log)
    change = {}
    for init in cfg.inits:
        for placement, pre_norm in PRE_NORM.items():
            for n in cfg.depths:
                for seed in cfg.seeds:
                    mcfg = get_preset(cfg.preset, **dict(cfg.overrides), vocab_size=vocab_size, dropout=0.0,
                                      init=init, pre_norm=pre_norm, layers=n)
                    model = Transformer(mcfg, seed=seed)
                    start = [p.data.copy() for p in model.parameters()]
                    for update in cfg.updates:
                        for p, w in zip(model.parameters(), start):  # every update starts from the same W
                            p.data[...] = w
                        got = output_change(model, batches[seed], cfg.lr, update, seed)
                        (change.setdefault(update, {}).setdefault(init, {}).setdefault(placement, {})
                         .setdefault(str(n), []).append(got))
                    budget.step(f"{init} {placement} N={n} seed {seed}", weight=n)
    config = dict(cfg.__dict__, overrides=dict(cfg.overrides))
    return {"study": NAME, "config": config, "vocab_size": vocab_size, "d_model": mcfg.d_model, "change": change,
            "seconds": round(budget.seconds, 1)}


def curve(results: dict, update: str, init: str, placement: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(depths, mean output change over seeds, per-seed changes (depths, seeds))."""
    by_n = results["change"][update][init][placement]
    depths = np.array([int(n) for n in by_n])
    per_seed = np.array([[r["change"] for r in by_n[str(n)]] for n in depths])
    return depths, per_seed.mean(1), per_seed


def fits(depths: np.ndarray, y: np.ndarray) -> dict:
    """R^2 of a straight line in N and of a straight line in log N (least squares), and the exponent p of
    the best power law ``y ~ N^p`` (a line through log y against log N)."""
    out = {}
    for name, x in (("linear", depths.astype(float)), ("log", np.log(depths.astype(float)))):
        if len(depths) < 3:
            out[name] = float("nan")
            continue
        a = np.polyfit(x, y, 1)
        resid = y - np.polyval(a, x)
        out[name] = float(1.0 - resid.var() / max(y.var(), 1e-300))
    out["exponent"] = float(np.polyfit(np.log(depths.astype(float)), np.log(y), 1)[0])
    return out


def findings(results: dict) -> list[dict]:
    """One row per (update, init, placement): the mean change per depth, its growth from the shallowest
    to the deepest N, the fits, and post-LN's change over pre-LN's at the deepest N."""
    rows = []
    for update, by_init in results["change"].items():
        for init, by_placement in by_init.items():
            deepest = {}
            for placement in by_placement:
                depths, y, _ = curve(results, update, init, placement)
                deepest[placement] = y[-1]
                f = fits(depths, y)
                rows.append({"update": update, "init": init, "placement": placement, "depths": depths.tolist(),
                             "change": y.tolist(), "growth": float(y[-1] / y[0]), "r2_linear": f["linear"],
                             "r2_log": f["log"], "exponent": f["exponent"]})
            ratio = float(deepest.get("post-LN", np.nan) / deepest.get("pre-LN", np.nan))
            for r in rows:
                if r["update"] == update and r["init"] == init:
                    r["post_over_pre_deepest"] = ratio
    return rows


def check(results: dict) -> list[str]:
    """Xavier (the analysis's setting). Random update: post-LN's exponent above POST_EXPONENT_MIN and above
    pre-LN's by EXPONENT_GAP_MIN. Both updates: post-LN's change at the deepest N above pre-LN's by a factor
    POST_OVER_PRE_MIN. Returns what fails (empty: the finding holds)."""
    failed = []
    rows = {(r["update"], r["init"], r["placement"]): r for r in findings(results)}
    for update in results["change"]:
        post, pre = rows.get((update, "xavier", "post-LN")), rows.get((update, "xavier", "pre-LN"))
        if post is None or pre is None:
            continue
        if update == "random":
            if not post["exponent"] > POST_EXPONENT_MIN:
                failed.append(f"random update, xavier post-LN: change ~ N^{post['exponent']:.2f}, expected an "
                              f"exponent above {POST_EXPONENT_MIN} (O(N))")
            if not post["exponent"] - pre["exponent"] > EXPONENT_GAP_MIN:
                failed.append(f"random update, xavier: pre-LN's change ~ N^{pre['exponent']:.2f} grows about as "
                              f"fast as post-LN's (N^{post['exponent']:.2f}); expected pre-LN's exponent lower by "
                              f"more than {EXPONENT_GAP_MIN}")
        if not post["post_over_pre_deepest"] > POST_OVER_PRE_MIN:
            failed.append(f"{update} update, xavier: post-LN/pre-LN change at the deepest N "
                          f"{post['post_over_pre_deepest']:.2f}, expected above {POST_OVER_PRE_MIN}")
    return failed


def table(results: dict) -> str:
    rows = []
    found = findings(results)
    for r in found:
        if r["update"] == "random":
            claim = "O(N)" if r["placement"] == "post-LN" else "O(log N)"
        else:
            claim = "grows faster than pre-LN" if r["placement"] == "post-LN" else "grows slower than post-LN"
        rows.append([r["update"], r["init"], r["placement"]] + [float(v) for v in r["change"]]
                    + [r["growth"], r["exponent"], r["r2_linear"], r["r2_log"],
                       r["post_over_pre_deepest"] if r["placement"] == "post-LN" else "", claim])
    depths = found[0]["depths"]
    c = results["config"]
    head = (f"# {TITLE}\n\n{CITATION}.\n\nMean squared change of the decoder output per token and feature "
            f"after moving every parameter but the embedding by lr = {c['lr']:g} (random: independent random "
            f"signs, the analysis's setting; adam: the first Adam step, about -lr sign(gradient)), {c['data']}, "
            f"mean over seeds {list(c['seeds'])}; N encoder + N decoder layers. growth = change at N={depths[-1]} "
            f"/ at N={depths[0]}; p: the exponent of the best fit change ~ N^p; R^2 of a straight line in N and in "
            "log N.\n\n")
    failed = check(results)
    tail = ("\nCheck: " + (f"the finding holds (random update, xavier: post-LN exponent > {POST_EXPONENT_MIN} "
                           f"and above pre-LN's by > {EXPONENT_GAP_MIN}; both updates: post/pre at the deepest N > "
                           f"{POST_OVER_PRE_MIN})" if not failed else "FAILED: " + "; ".join(failed))
            + f"\n\nMeasured in {results['seconds']:.0f} s.\n")
    header = (["update", "init", "placement"] + [f"N={n}" for n in depths]
              + ["growth", "p", "R^2 line", "R^2 log", "post/pre (deepest)", "paper"])
    return head + markdown_table(header, rows) + tail


def picture(results: dict, path) -> Path:
    """One panel per (update, init): the output change against N, one line per placement (band: seeds)."""
    plt = pyplot()
    panels = [(u, i) for u in results["change"] for i in results["change"][u]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    colours = {"post-LN": "tab:red", "pre-LN": "tab:blue"}
    for ax, (update, init) in zip(axes[0], panels):
        for placement in results["change"][update][init]:
            depths, y, per_seed = curve(results, update, init, placement)
            ax.plot(depths, y, marker="o", color=colours.get(placement), label=placement)
            ax.fill_between(depths, per_seed.min(1), per_seed.max(1), color=colours.get(placement), alpha=0.2)
        ax.set_title(f"{update} update, init={init}", fontsize=10)
        ax.set_xlabel("N (encoder and decoder layers each)")
        ax.set_ylabel("|F(x0,W) - F(x0,W*)|^2 per token / d")
        ax.set_xticks(depths)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Liu et al. 2020: output change of one update against depth (numformer, "
                 f"d_model {results['d_model']})", fontsize=10)
    return save_figure(fig, path)


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Measure, then write ``OUT/output-change.png``, ``.md`` and ``.json``."""
    out = Path(out)
    results = measure(cfg, out / "data", log)
    return write_outputs(out, NAME, results, check, picture, table)
