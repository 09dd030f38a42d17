"""ln-placement: where LayerNorm sits decides how gradients are spread over the layers at initialisation.

Paper: Ruibin Xiong, Yunchang Yang, Di He, Kai Zheng, Shuxin Zheng, Chen Xing, Huishuai Zhang, Yanyan Lan,
Liwei Wang, Tie-Yan Liu, "On Layer Normalization in the Transformer Architecture", ICML 2020
(arXiv:2002.04745), Figure 3 and Theorem 1.

Claim: at initialisation the gradient norm of each layer's feed-forward weights grows toward the output in
a post-LN Transformer (the paper's, ``LN(x + F(x))``) and stays about flat in a pre-LN one
(``x + F(LN(x))`` and a final LN); Theorem 1 bounds the last layer's ``||dL/dW^{2,L}||_F`` by
``O(d sqrt(ln d))`` for post-LN and ``O(d sqrt(ln d / L))`` for pre-LN, so post-LN's last layer should be
about ``sqrt(L)`` times pre-LN's. The theorem is proved for a simplified Transformer at Xavier
initialisation: every sub-layer branch ``F(x)`` then has a variance comparable to the stream ``x`` it is
added to, so each post-LN LayerNorm divides by about ``sqrt(1 + Var F / Var x) > 1`` and the gradient
shrinks by that factor at every layer on its way down.

What numformer measures: the gradient of the training loss (label-smoothed cross-entropy, mean over
target tokens) at initialisation, for both placements, both of numformer's initialisations
(``init="xavier"``, the theorem's; ``init="pytorch"``, numformer's default, ``torch.nn.Transformer``'s),
on random tokens and on real sentences (bible-en-es, its 8,000-piece vocabulary), encoder and decoder.
Per layer: ``||dL/dW_1||`` and ``||dL/dW_2||`` of the feed-forward block, and ``std(F(x)) / std(x)`` of
every feed-forward branch against the stream it joins (the quantity the theorem's argument turns on).

Shapes and seeds (``FULL``): base (N = 6, d_model 512, d_ff 2048, 8 heads), vocabulary 8,000, dropout 0,
float32; seeds 1, 2, 3 (weights and batches); per seed 2 batches of 32 sentence pairs of each kind:
random tokens (30 a side, no padding) and bible-en-es training pairs of at most 64 subwords a side.

What numformer found: the gradient norms per layer, the branch ratios, the comparison with Theorem 1 and
where the measurement departs from the paper are in docs/studies.md (section ln-placement), not here;
``OUT/ln-placement.md`` is what a run of this code writes.

Where it differs: the theorem is proved for a simplified Transformer at Xavier initialisation; numformer
measures the full model, both of its initialisations, random tokens and real sentences (how far each
agrees: docs/studies.md).

Command: ``python -m numformer.studies ln-placement [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most 6 minutes on 2 cores (the measured time: docs/studies.md).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..layers import Residual
from ..model import Transformer
from ..module import tapped
from ..presets import get_preset
from .common import (Budget, bible_data, gradient_at, markdown_table, param_norm, pyplot, random_batch,
                     sentence_batch, save_figure, write_outputs)

NAME = "ln-placement"
TITLE = "Xiong et al. 2020, Figure 3 / Theorem 1: FFN gradient norm per layer at initialisation, post-LN vs pre-LN"
CITATION = ("R. Xiong, Y. Yang, D. He, K. Zheng, S. Zheng, C. Xing, H. Zhang, Y. Lan, L. Wang, T.-Y. Liu, "
            "On Layer Normalization in the Transformer Architecture, ICML 2020 (arXiv:2002.04745), "
            "Figure 3 and Theorem 1")
MINUTES = 6  # stated time on 2 cores (measured 2.3 min; see the docstring)

#: The placements compared, by name -> ModelConfig.pre_norm (a test plants a change here).
PRE_NORM = {"post-LN": False, "pre-LN": True}
STACKS = ("encoder", "decoder")

# The qualitative finding, as bounds the measured figures clear with margin (checked by check()).
POST_RISE_MIN = 2.5         # xavier, decoder: post-LN last/first W_2 gradient norm (measured 6.0-6.3 FULL, 4.1 SMALL)
PRE_FLAT = (0.4, 1.6)       # xavier, decoder: pre-LN last/first within this band (0.64-0.67 FULL, 0.61 SMALL)
PYTORCH_POST_MAX = 0.9      # pytorch init, decoder: post-LN last/first below this (0.66-0.67 FULL, 0.73 SMALL)


@dataclass(frozen=True)
class Config:
    """What one run of the study measures: the model shape (a preset with overrides), the initialisations,
    the data kinds, the seeds and how many batches of how many sentences per seed and kind."""

    preset: str = "base"
    overrides: tuple = ()             # (field, value) pairs changing the preset (the CI's small shape)
    vocab_size: int = 8000            # random tokens only (real sentences use the corpus's vocabulary)
    inits: tuple = ("xavier", "pytorch")
    data: tuple = ("random", "sentences")
    seeds: tuple = (1, 2, 3)
    batches: int = 2                  # per seed and data kind
    sentences: int = 32
    length: int = 30                  # random tokens per sentence and side
    max_len: int = 64                 # real sentences: at most this many subwords a side


FULL = Config()
#: The CI's configuration: 6 + 6 layers as in base, narrower, random tokens only, seconds on 2 cores.
SMALL = Config(overrides=(("d_model", 128), ("d_ff", 512), ("heads", 4)), vocab_size=1000, inits=("xavier", "pytorch"),
               data=("random",), seeds=(1, 2), batches=1, sentences=16, length=20)


@contextlib.contextmanager
def branch_ratios(model, into: dict):
    """While active, each feed-forward residual of ``model`` records ``std(F(x)) / std(x)`` into
    ``into[name]`` (a list per residual): the size of the branch against the stream it is added to
    (for pre-LN, F sees LN(x) but joins x itself). Host floats: this is an instrument, not training."""
    names = {id(res): name for name, res in model.named_modules()
             if isinstance(res, Residual) and name.endswith("ffn_residual")}

    def measure_branch(res, forward, x, sublayer, *args, **kwargs):
        def measured(*a, **k):
            y = sublayer(*a, **k)
            into.setdefault(names[id(res)], []).append(float(y.std()) / max(float(x.std()), 1e-30))
            return y
        return forward(x, measured, *args, **kwargs)

    # a forward tap on each residual (numformer.module.Module.tap)
    with tapped([res for _, res in model.named_modules() if id(res) in names], forward=measure_branch):
        yield into


def layer_names(stack: str, n: int, weight: str) -> list[str]:
    return [f"{stack}.layers.{i}.ffn.{weight}.weight" for i in range(n)]


def model_config(cfg: Config, init: str, pre_norm: bool, vocab_size: int):
    return get_preset(cfg.preset, **dict(cfg.overrides), vocab_size=vocab_size, dropout=0.0, init=init,
                      pre_norm=pre_norm)


def measure(cfg: Config = FULL, data_dir=None, log=print) -> dict:
    """Every gradient norm and branch ratio of the configuration -> a JSON-able dict (see :func:`run`)."""
    data = None
    if "sentences" in cfg.data:
        data = bible_data(Path(data_dir or "runs/studies/data"), log)
    vocab_size = data.vocab.size if data is not None else cfg.vocab_size
    # the same batches for every initialisation and placement: drawn once per seed
    batches = {}
    for seed in cfg.seeds:
        rng = np.random.default_rng(seed)
        for kind in cfg.data:
            for b in range(cfg.batches):
                if kind == "random":
                    batches[seed, kind, b] = random_batch(rng, cfg.sentences, cfg.length, vocab_size)
                else:
                    batches[seed, kind, b] = sentence_batch(data, rng, cfg.sentences, cfg.max_len)
    shape = model_config(cfg, cfg.inits[0], False, vocab_size)
    n = {"encoder": shape.layers, "decoder": shape.n_decoder_layers}
    budget = Budget(NAME, len(cfg.inits) * len(PRE_NORM) * len(cfg.seeds), MINUTES, log)
    grads, branches, losses = {}, {}, {}
    for init in cfg.inits:
        for placement, pre_norm in PRE_NORM.items():
            for seed in cfg.seeds:
                model = Transformer(model_config(cfg, init, pre_norm, vocab_size), seed=seed)
                ratios = {}
                for kind in cfg.data:
                    for b in range(cfg.batches):
                        with branch_ratios(model, ratios):
                            loss = gradient_at(model, batches[seed, kind, b])
                        losses.setdefault(init, {}).setdefault(placement, {}).setdefault(kind, []).append(loss)
                        params = dict(model.named_parameters())
                        for stack in STACKS:
                            for w in ("w_1", "w_2"):
                                row = [param_norm(params[p]) for p in layer_names(stack, n[stack], w)]
                                (grads.setdefault(init, {}).setdefault(placement, {}).setdefault(kind, {})
                                 .setdefault(stack, {}).setdefault(w, []).append(row))
                for stack in STACKS:
                    per_layer = [float(np.mean(ratios[f"{stack}.layers.{i}.ffn_residual"])) for i in range(n[stack])]
                    branches.setdefault(init, {}).setdefault(placement, {}).setdefault(stack, []).append(per_layer)
                budget.step(f"{init} {placement} seed {seed}")
    return {"study": NAME, "config": _config_dict(cfg), "vocab_size": vocab_size, "layers": n, "grads": grads,
            "branch_ratio": branches, "loss": losses, "seconds": round(budget.seconds, 1)}


def _config_dict(cfg: Config) -> dict:
    d = dict(cfg.__dict__)
    d["overrides"] = dict(cfg.overrides)
    return d


def mean_profile(results: dict, init: str, placement: str, kind: str, stack: str, w: str = "w_2") -> np.ndarray:
    """Mean over seeds and batches of the per-layer gradient norms (layer 1 first)."""
    return np.mean(np.array(results["grads"][init][placement][kind][stack][w]), axis=0)


def findings(results: dict) -> list[dict]:
    """One row per (init, data, stack, placement): first and last layer's mean W_2 gradient norm, their
    ratio, post-LN's last layer against pre-LN's, and the mean branch ratio."""
    rows = []
    for init, by_placement in results["grads"].items():
        for kind in next(iter(by_placement.values())):
            for stack in STACKS:
                last = {p: mean_profile(results, init, p, kind, stack)[-1] for p in by_placement}
                for placement in by_placement:
                    prof = mean_profile(results, init, placement, kind, stack)
                    branch = float(np.mean(results["branch_ratio"][init][placement][stack]))
                    loss = float(np.mean(results["loss"][init][placement][kind]))
                    rows.append({"init": init, "data": kind, "stack": stack, "placement": placement, "loss": loss,
                                 "first": float(prof[0]), "last": float(prof[-1]),
                                 "last_over_first": float(prof[-1] / prof[0]),
                                 "post_over_pre_last": float(last.get("post-LN", np.nan) / last.get("pre-LN", np.nan)),
                                 "branch_ratio": branch})
    return rows


def expectation(row: dict) -> str:
    """What the paper leads one to expect for this row (the claim beside the measurement)."""
    if row["init"] != "xavier":
        return "paper: Xavier only (no claim)"
    return "rises toward the output" if row["placement"] == "post-LN" else "about flat"


def check(results: dict) -> list[str]:
    """The qualitative finding as bounds (module constants); returns what fails (empty: it holds).

    Xavier, decoder: post-LN's last/first W_2 gradient norm above POST_RISE_MIN, pre-LN's within PRE_FLAT.
    pytorch init, decoder: post-LN's below PYTORCH_POST_MAX (numformer's finding: no rise)."""
    failed = []
    for r in findings(results):
        if r["stack"] != "decoder":
            continue
        ratio, where = r["last_over_first"], f"{r['init']} {r['data']} decoder {r['placement']}"
        if r["init"] == "xavier" and r["placement"] == "post-LN" and not ratio > POST_RISE_MIN:
            failed.append(f"{where}: last/first {ratio:.2f}, expected above {POST_RISE_MIN}")
        if r["init"] == "xavier" and r["placement"] == "pre-LN" and not PRE_FLAT[0] < ratio < PRE_FLAT[1]:
            failed.append(f"{where}: last/first {ratio:.2f}, expected within {PRE_FLAT}")
        if r["init"] == "pytorch" and r["placement"] == "post-LN" and not ratio < PYTORCH_POST_MAX:
            failed.append(f"{where}: last/first {ratio:.2f}, expected below {PYTORCH_POST_MAX}")
    return failed


def table(results: dict) -> str:
    """The markdown table: the paper's claim beside numformer's measurement, every configuration."""
    rows = [[r["init"], r["data"], r["stack"], r["placement"], r["loss"], r["first"], r["last"], r["last_over_first"],
             r["post_over_pre_last"] if r["placement"] == "post-LN" else "", r["branch_ratio"], expectation(r)]
            for r in findings(results)]
    head = (f"# {TITLE}\n\n{CITATION}.\n\nGradient norm of the feed-forward block's W_2 at initialisation, mean "
            f"over seeds {list(results['config']['seeds'])} x {results['config']['batches']} batch(es) of "
            f"{results['config']['sentences']} sentences; L = {results['layers']['decoder']} layers, so "
            f"Theorem 1's post/pre ratio at the last layer is about sqrt(L) = "
            f"{np.sqrt(results['layers']['decoder']):.2f}. branch = mean std(F(x)) / std(x) of the feed-forward "
            f"branches; loss = the training loss at initialisation (log V = {np.log(results['vocab_size']):.2f}).\n\n")
    failed = check(results)
    tail = "\nCheck: " + ("the finding holds (" + ", ".join(
        [f"xavier decoder post-LN rise > {POST_RISE_MIN}", f"pre-LN within {PRE_FLAT}",
         f"pytorch post-LN < {PYTORCH_POST_MAX}"]) + ")" if not failed else "FAILED: " + "; ".join(failed))
    tail += f"\n\nMeasured in {results['seconds']:.0f} s.\n"
    return head + markdown_table(["init", "data", "stack", "placement", "loss", "layer 1",
                                  f"layer {results['layers']['decoder']}",
                                  "last/first", "post/pre (last)", "branch", "paper"], rows) + tail


def picture(results: dict, path) -> Path:
    """Rows: encoder, decoder; columns: init x data; one line per placement (mean, band = min..max over
    seeds and batches): ||dL/dW_2|| against the layer."""
    plt = pyplot()
    inits = list(results["grads"])
    kinds = list(next(iter(results["grads"][inits[0]].values())))
    cols = [(i, k) for i in inits for k in kinds]
    fig, axes = plt.subplots(2, len(cols), figsize=(3.6 * len(cols), 6.4), squeeze=False)
    colours = {"post-LN": "tab:red", "pre-LN": "tab:blue"}
    for r, stack in enumerate(STACKS):
        for c, (init, kind) in enumerate(cols):
            ax = axes[r, c]
            for placement in results["grads"][init]:
                a = np.array(results["grads"][init][placement][kind][stack]["w_2"])
                x = np.arange(1, a.shape[1] + 1)
                ax.plot(x, a.mean(0), marker="o", ms=3, color=colours.get(placement), label=placement)
                ax.fill_between(x, a.min(0), a.max(0), color=colours.get(placement), alpha=0.2)
            ax.set_title(f"{stack}, init={init}, {kind}", fontsize=9)
            ax.set_xlabel("layer")
            ax.set_xticks(x)
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
            if c == 0:
                ax.set_ylabel("||dL/dW_2|| at init")
            ax.legend(fontsize=7)
    fig.suptitle("Xiong et al. 2020, Fig. 3: FFN W_2 gradient norm per layer at initialisation "
                 f"(numformer, {results['config']['preset']} shape)", fontsize=10)
    return save_figure(fig, path)


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Measure, then write ``OUT/ln-placement.png`` (the picture), ``.md`` (the table) and ``.json``."""
    out = Path(out)
    results = measure(cfg, out / "data", log)
    return write_outputs(out, NAME, results, check, picture, table)
