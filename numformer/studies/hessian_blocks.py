"""hessian-blocks: the Hessian spectrum of each parameter block differs from block to block ("block heterogeneity").

Paper: Yushun Zhang, Congliang Chen, Tian Ding, Ziniu Li, Ruoyu Sun, Zhi-Quan Luo, "Why Transformers Need
Adam: A Hessian Perspective", NeurIPS 2024 (arXiv:2402.16788), Figure 3 and the JS^0 measure.

Claim: in a Transformer the Hessian spectra of different parameter blocks (query, key, value, output,
feed-forward, LayerNorm, embedding) differ greatly from each other, unlike a CNN's, whose blocks' spectra
are alike; the averaged Jensen-Shannon distance between the blocks' spectra at initialisation (JS^0)
measures this "block heterogeneity", which hampers a single learning rate (SGD) and is why Transformers
need Adam. Their Figure 3 plots the spectra normalised by each block's 10th largest eigenvalue, the
frequency on a log scale; they compute spectra by their own stochastic Lanczos quadrature (PyHessian
computes only whole-model spectra).

What numformer measures: a small encoder-decoder at initialisation and after some Adam training, in
float64 without dropout. For each block, ``H v`` exactly, by forward over reverse (every layer's jvp and the
tangent of its backward, numformer/curvature/hvp.py; equal to PyTorch's double backpropagation to 1e-10),
Lanczos with full reorthogonalisation for the top of the spectrum (the 10th largest Ritz value normalises
it, as theirs) and stochastic Lanczos quadrature for its density (numformer/curvature/lanczos.py). Blocks:
encoder layer 1's query, key, value and output projections (W^Q, W^K, W^V, W^O), its feed-forward W_1 and
its second LayerNorm's gain and bias, and the tied vocabulary matrix; and, as a control, the same kind of
block one layer up (layer 2's W^Q, W_1 and LayerNorm); and layer by layer (every parameter of one encoder or
decoder layer as one block, the per-layer spectra PyHessian's users ask for, its issue #10). Heterogeneity: the mean Jensen-Shannon distance between
blocks of different kinds (JS^0 at initialisation), and for each control block its distance to its kind
in layer 1 against that kind's mean distance to the other kinds: spectra that differ *by kind* are closer
within a kind than across kinds. Spectra are normalised by each block's largest eigenvalue magnitude for
the check, and also as the paper, by the 10th largest eigenvalue (both are reported).

Shapes and seeds (``FULL``): d_model 64, 2 + 2 layers, 4 heads, d_ff 256, bible-en-es's 8,000-piece
vocabulary, one batch of 16 sentence pairs (each side at most 24 subwords) for the Hessian; training 200
Adam steps (Eq. 3, warm-up 50, factor 1) on batches of 32 pairs; SLQ with 4 Rademacher probes of 30 steps,
the top from 40 steps; densities smoothed by a Gaussian of width 0.05 (in the normalised unit) on a common
grid; seed 1.

Precision, and the method it replaced: for each block, three random directions' products in float64 exact
against float32 exact, against float64 central differences of gradients (the method before forward mode,
``method="differences"``) and against float32 central differences; and the block's largest eigenvalue by 20
Lanczos steps on the float64 differences against the same on exact products (one start).

What numformer found: the measured spectra, distances and control ratios, and the commit they were measured
at, are in docs/studies.md (section hessian-blocks), not here; ``OUT/hessian-blocks.md`` is what a run of
this code writes.

Where it differs: Zhang et al. measure BERT (and compare with CNNs); here a small encoder-decoder of 0.6M
parameters, one seed, one batch, 200 steps of training, and no CNN to compare with. The check uses each
block's largest eigenvalue magnitude as the unit rather than the paper's lambda_10: in blocks of 128 to
16,000 parameters lambda_10 lies inside the bulk of the spectrum, where it is small and noisy (both units
are reported).

Command: ``python -m numformer.studies hessian-blocks [--out DIR]`` (``--small``: the CI's configuration).
Time: stated at most ``MINUTES`` (12) minutes on 2 cores, what the progress lines measure against; measured
10.6 min (636 s): the blocks' spectra 6 min, the per-layer spectra 2.6, the precision rows 1.3 and the training
0.6; docs/studies.md has the figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..curvature.hvp import BlockHessian, layer_blocks
from ..curvature.lanczos import density, extreme_eigenvalues, slq
from ..model import Transformer
from ..presets import get_preset
from .common import (Budget, adam_steps, bible_data, markdown_table, pyplot, random_batch, save_figure, sentence_batch,
                     write_outputs)

NAME = "hessian-blocks"
TITLE = "Zhang et al. 2024, Figure 3: per-block Hessian spectra (block heterogeneity), at init and after training"
CITATION = ("Y. Zhang, C. Chen, T. Ding, Z. Li, R. Sun, Z.-Q. Luo, Why Transformers Need Adam: A Hessian "
            "Perspective, NeurIPS 2024 (arXiv:2402.16788), Figure 3 and JS^0")
MINUTES = 12  # stated time on 2 cores (measured 10.6 min; see the docstring)

#: block name -> the parameters it holds (encoder layer 1 = "layers.0", the embedding, and controls in layer 2)
BLOCKS = {
    "query": ["encoder.layers.0.self_attn.w_q.weight"],
    "key": ["encoder.layers.0.self_attn.w_k.weight"],
    "value": ["encoder.layers.0.self_attn.w_v.weight"],
    "output": ["encoder.layers.0.self_attn.w_o.weight"],
    "FFN": ["encoder.layers.0.ffn.w_1.weight"],
    "LayerNorm": ["encoder.layers.0.ffn_residual.norm.weight", "encoder.layers.0.ffn_residual.norm.bias"],
    "embedding": ["src_embed.weight"],
}
#: control blocks: the same kind one layer up (a test plants a change here)
CONTROLS = {
    "query (layer 2)": ("query", ["encoder.layers.1.self_attn.w_q.weight"]),
    "FFN (layer 2)": ("FFN", ["encoder.layers.1.ffn.w_1.weight"]),
    "LayerNorm (layer 2)": ("LayerNorm", ["encoder.layers.1.ffn_residual.norm.weight",
                                          "encoder.layers.1.ffn_residual.norm.bias"]),
}
#: the per-layer blocks: every parameter of each of these layers (numformer.curvature.hvp.layer_blocks)
LAYERS = ("encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1")
#: a kind's mean JS distance to the other kinds over its control's to it, at initialisation (largest-magnitude
#: unit); docs/studies.md, hessian-blocks, has the ratios measured for FULL and SMALL
HETEROGENEITY_MIN = 1.3


@dataclass(frozen=True)
class Config:
    preset: str = "small"
    overrides: tuple = (("d_model", 64), ("d_ff", 256), ("heads", 4), ("layers", 2))
    data: str = "sentences"       # or "random" (the CI's)
    vocab_size: int = 1000        # "random" only
    sentences: int = 16           # the Hessian's batch
    max_len: int = 24
    length: int = 12              # "random": tokens per sentence
    train_steps: int = 200
    train_sentences: int = 32
    warmup: int = 50
    lr_factor: float = 1.0
    probes: int = 4
    slq_steps: int = 30
    top_steps: int = 40
    sigma: float = 0.05
    seed: int = 1
    layers: tuple = LAYERS              # the per-layer blocks
    precision_blocks: tuple = tuple(BLOCKS)  # the blocks whose products are also taken the other ways
    precision_directions: int = 3       # random directions per block for the products' errors
    precision_steps: int = 20           # Lanczos steps of the largest eigenvalue by differences against exact


FULL = Config()
#: The CI's configuration: a tiny model on random tokens, seconds on 2 cores.
SMALL = Config(overrides=(("d_model", 32), ("d_ff", 128), ("heads", 4), ("layers", 2)), data="random", vocab_size=300,
               sentences=8, length=12, train_steps=30, train_sentences=8, warmup=10, probes=3, slq_steps=20,
               top_steps=24, layers=("encoder.layers.0", "decoder.layers.1"), precision_blocks=("query", "LayerNorm"),
               precision_directions=1)


def _batch(cfg: Config, data, rng, sentences: int):
    if data is None:
        return random_batch(rng, sentences, cfg.length, cfg.vocab_size)
    return sentence_batch(data, rng, sentences, cfg.max_len)


def train(model, cfg: Config, data, rng) -> list:
    """``train_steps`` Adam steps of the float64 model on fresh batches; the training losses."""
    batches = (_batch(cfg, data, rng, cfg.train_sentences) for _ in range(cfg.train_steps))
    return [float(to_host(loss)) for loss in adam_steps(model, batches, cfg.warmup, cfg.lr_factor)]


def spectrum(model, batch, names, cfg: Config, rng) -> dict:
    """One block's top (Lanczos) and density quadrature (SLQ), at the model's current weights, by exact products."""
    hessian = BlockHessian(model, batch, names)
    top, low, _ = extreme_eigenvalues(hessian, hessian.dim, cfg.top_steps, rng, top=10)
    nodes, weights = slq(hessian, hessian.dim, cfg.slq_steps, cfg.probes, rng)
    lam10 = float(top[min(9, len(top) - 1)])
    return {"dim": hessian.dim, "top": [float(t) for t in top], "min": low, "lambda10": lam10,
            "nodes": nodes.tolist(), "weights": weights.tolist(), "products": hessian.evaluations}


def precision(model, model32, batch, names, cfg: Config, rng) -> dict:
    """How far the other ways of taking the block's ``H v`` are from float64's exact product: float32 exact,
    float64 and float32 central differences of gradients (the worst relative error over ``precision_directions``
    random directions), and the largest eigenvalue by Lanczos (``precision_steps`` from one start) on float64
    differences of gradients, the method the exact products replaced, against float64 exact ones."""
    exact = BlockHessian(model, batch, names)
    ways = {"exact float32": BlockHessian(model32, batch, names),
            "differences float64": BlockHessian(model, batch, names, method="differences"),
            "differences float32": BlockHessian(model32, batch, names, method="differences", allow_float32=True)}
    errors = {way: 0.0 for way in ways}
    for _ in range(cfg.precision_directions):
        v = rng.standard_normal(exact.dim)
        hv = exact(v)
        for way, other in ways.items():
            got = np.asarray(to_host(other(v.astype(other.dtype))), dtype=np.float64)
            errors[way] = max(errors[way], float(np.linalg.norm(got - hv) / np.linalg.norm(hv)))
    start = int(rng.integers(1 << 31))
    tops = {way: float(extreme_eigenvalues(h, h.dim, cfg.precision_steps, np.random.default_rng(start))[0][0])
            for way, h in (("exact float64", exact), ("differences float64", ways["differences float64"]))}
    return {"product_errors": errors, "top": tops,
            "top_errors": {way: abs(t - tops["exact float64"]) / abs(tops["exact float64"])
                           for way, t in tops.items() if way != "exact float64"}}


def measure(cfg: Config = FULL, data_dir=None, log=print) -> dict:
    """Every block's spectrum at initialisation and after training (JSON-able)."""
    data = bible_data(Path(data_dir or "runs/studies/data"), log) if cfg.data == "sentences" else None
    vocab_size = data.vocab.size if data is not None else cfg.vocab_size
    rng = np.random.default_rng(cfg.seed)
    batch = _batch(cfg, data, rng, cfg.sentences)
    mcfg = get_preset(cfg.preset, **dict(cfg.overrides), vocab_size=vocab_size, dropout=0.0)
    model = Transformer(mcfg, seed=cfg.seed, dtype=np.float64)
    blocks = {**BLOCKS, **{name: names for name, (_, names) in CONTROLS.items()}}
    by_layer = {name: names for name, names in layer_blocks(model).items() if name in cfg.layers}
    budget = Budget(NAME, 2 * (len(blocks) + len(by_layer) + len(cfg.precision_blocks)), MINUTES, log)
    states, layers, precisions, losses = {}, {}, {}, []
    for state in ("initialisation", "trained"):
        if state == "trained":
            losses = train(model, cfg, data, rng)
        states[state], layers[state], precisions[state] = {}, {}, {}
        for name, names in blocks.items():
            states[state][name] = spectrum(model, batch, names, cfg, np.random.default_rng([cfg.seed, len(name)]))
            budget.step(f"{state} {name}")
        for name, names in by_layer.items():
            layers[state][name] = spectrum(model, batch, names, cfg, np.random.default_rng([cfg.seed, len(name)]))
            budget.step(f"{state} {name}")
        model32 = Transformer(mcfg, seed=cfg.seed, dtype=np.float32)
        model32.load_state_dict(model.state_dict())
        for name in cfg.precision_blocks:
            names = BLOCKS[name]
            precisions[state][name] = precision(model, model32, batch, names, cfg,
                                                np.random.default_rng([cfg.seed, len(name), 32]))
            budget.step(f"{state} {name}: float32 and differences")
    return {"study": NAME, "config": {**cfg.__dict__, "overrides": dict(cfg.overrides)}, "vocab_size": vocab_size,
            "states": states, "layers": layers, "precision": precisions, "train_loss": losses,
            "seconds": round(budget.seconds, 1)}


def scale_of(block: dict, normaliser: str = "max") -> float:
    """The spectrum's unit: ``"max"`` the largest eigenvalue magnitude (numformer's), ``"lambda10"`` the 10th largest
    eigenvalue (Zhang et al.'s; the largest magnitude where it is not positive)."""
    largest = max(max(abs(t) for t in block["top"]), abs(block["min"]))
    if normaliser == "lambda10" and block["lambda10"] > 0:
        return block["lambda10"]
    return largest


def normalised_density(block: dict, grid, sigma: float, normaliser: str = "max"):
    """The block's SLQ density of eigenvalue / its unit (:func:`scale_of`) on ``grid``, as probabilities summing
    to 1."""
    scale = scale_of(block, normaliser)
    d = density(np.array(block["nodes"]) / scale, np.array(block["weights"]), grid, sigma)
    return d / d.sum()


def js_distance(p, q) -> float:
    """Jensen-Shannon distance (base 2: in [0, 1]) between two probability vectors on one grid."""
    m = (p + q) / 2

    def kl(a, b):
        keep = a > 1e-300  # below, halving a probability underflows to 0 in m and a / m would be inf
        return float((a[keep] * np.log2(a[keep] / b[keep])).sum())
    return float(np.sqrt(max(0.5 * kl(p, m) + 0.5 * kl(q, m), 0.0)))


def grid_of(state: dict, sigma: float, normaliser: str = "max"):
    reach = max(float(np.abs(np.array(b["nodes"])).max()) / scale_of(b, normaliser) for b in state.values())
    reach = min(reach, 1e3)  # a block whose lambda_10 is tiny against its extremes: clip the axis
    return np.linspace(-reach - 4 * sigma, reach + 4 * sigma, 4001)


def heterogeneity(state: dict, sigma: float, normaliser: str = "max") -> dict:
    """The JS distances between the spectra: every pair of the main blocks (kinds), their mean (``across``;
    JS^0 at initialisation), and for each control (a kind one layer up) its distance to its kind in layer 1
    (``within``) against that kind's mean distance to the other kinds (``kind_across``)."""
    grid = grid_of(state, sigma, normaliser)
    dens = {name: normalised_density(b, grid, sigma, normaliser) for name, b in state.items()}
    main = list(BLOCKS)
    pairs = {(a, b): js_distance(dens[a], dens[b]) for i, a in enumerate(main) for b in main[i + 1:]}
    controls = {}
    for control, (kind, _) in CONTROLS.items():
        others = [d for (a, b), d in pairs.items() if kind in (a, b)]
        controls[control] = {"kind": kind, "within": js_distance(dens[control], dens[kind]),
                             "kind_across": float(np.mean(others))}
    return {"across": float(np.mean(list(pairs.values()))), "pairs": {f"{a} / {b}": d for (a, b), d in pairs.items()},
            "controls": controls}


def findings(results: dict) -> list[dict]:
    """Per state: JS^0-style mean across kinds, each control's within-kind distance against its kind's mean
    distance to the other kinds, and every block's extremes."""
    sigma = results["config"]["sigma"]
    rows = []
    for state, blocks in results["states"].items():
        h = heterogeneity(blocks, sigma)
        paper = heterogeneity(blocks, sigma, "lambda10")
        rows.append({"state": state, "js_across": h["across"], "controls": h["controls"], "pairs": h["pairs"],
                     "js_across_lambda10": paper["across"], "controls_lambda10": paper["controls"],
                     "top": {n: b["top"][0] for n, b in blocks.items()},
                     "lambda10": {n: b["lambda10"] for n, b in blocks.items()},
                     "min": {n: b["min"] for n, b in blocks.items()}})
    return rows


def check(results: dict) -> list[str]:
    """Block heterogeneity at initialisation: each control block's spectrum is closer to its own kind in the
    layer below than that kind is, on average, to the other kinds, by more than HETEROGENEITY_MIN (the spectra
    differ by kind, not by chance)."""
    failed = []
    for r in findings(results):
        if r["state"] != "initialisation":
            continue
        for control, c in r["controls"].items():
            ratio = c["kind_across"] / c["within"] if c["within"] > 0 else float("inf")
            if not ratio > HETEROGENEITY_MIN:
                failed.append(f"at initialisation {control} is {c['within']:.3f} (JS) from its kind in layer 1, "
                              f"and {c['kind']} {c['kind_across']:.3f} from the other kinds: ratio {ratio:.2f}, "
                              f"expected above {HETEROGENEITY_MIN}")
    return failed


def table(results: dict) -> str:
    rows = findings(results)
    head = (f"# {TITLE}\n\n{CITATION}.\n\nSpectra by stochastic Lanczos quadrature, normalised by each block's largest "
            f"eigenvalue magnitude (the check's), and, as the paper, by its 10th largest eigenvalue (Ritz value; by the "
            f"largest magnitude where that is not positive), smoothed by a "
            f"Gaussian of width {results['config']['sigma']}. JS across = the mean Jensen-Shannon distance (base 2) "
            f"between blocks of different kinds (encoder layer 1 and the embedding; JS^0 at initialisation). For each "
            f"control (the kind one layer up): its distance to its kind (within) against that kind's mean distance "
            f"to the other kinds.\n\n")
    summary = markdown_table(["state", "unit", "JS across kinds"] + [f"{c}: within / kind's across" for c in CONTROLS],
                             [[r["state"], unit, r[f"js_across{key}"]]
                              + [f"{c['within']:.3f} / {c['kind_across']:.3f}" for c in r[f"controls{key}"].values()]
                              for r in rows for unit, key in (("largest magnitude", ""), ("lambda_10 (paper)",
                                                                                             "_lambda10"))])
    blocks = list(results["states"]["initialisation"])
    detail = markdown_table(["block", "dim"] + [f"{s} {k}" for s in results["states"] for k in ("max", "lambda_10", "min")],
                            [[b, results["states"]["initialisation"][b]["dim"]]
                             + [v for r in rows for v in (r["top"][b], r["lambda10"][b], r["min"][b])]
                             for b in blocks])
    pairs = markdown_table(["blocks"] + [r["state"] for r in rows],
                           [[p] + [r["pairs"][p] for r in rows] for p in rows[0]["pairs"]])
    layer_names = list(results["layers"]["initialisation"])
    layers = markdown_table(["layer (every parameter)", "dim"] + [f"{s} {k}" for s in results["layers"]
                                                                  for k in ("max", "lambda_10", "min")],
                            [[n, results["layers"]["initialisation"][n]["dim"]]
                             + [v for s in results["layers"] for v in (results["layers"][s][n]["top"][0],
                                                                       results["layers"][s][n]["lambda10"],
                                                                       results["layers"][s][n]["min"])]
                             for n in layer_names])
    ways = list(next(iter(results["precision"]["initialisation"].values()))["product_errors"])
    tops = list(next(iter(results["precision"]["initialisation"].values()))["top_errors"])
    precision_rows = [[state, b] + [p["product_errors"][w] for w in ways] + [p["top_errors"][w] for w in tops]
                      for state, blocks_ in results["precision"].items() for b, p in blocks_.items()]
    precision = markdown_table(["state", "block"] + [f"H v: {w}" for w in ways] + [f"lambda_max: {w}" for w in tops],
                               precision_rows)
    failed = check(results)
    tail = ("\nPer layer (every parameter of the layer one block; exact products, float64):\n\n" + layers
            + f"\nPrecision: the relative error of {results['config']['precision_directions']} random directions' H v (the "
            "worst) and of the "
            "largest eigenvalue (Lanczos, the same start), each against float64's exact products:\n\n" + precision)
    tail += ("\nCheck: " + (f"the finding holds (each kind over its control's distance > {HETEROGENEITY_MIN} at "
                            "initialisation)" if not failed else "FAILED: " + "; ".join(failed)))
    tail += f"\n\nMeasured in {results['seconds']:.0f} s.\n"
    return head + summary + "\n" + detail + "\nJS distance of every pair of kinds:\n\n" + pairs + tail


def picture(results: dict, path) -> Path:
    """Per state, as Zhang et al.'s Figure 3 (spectra in units of each block's lambda_10, log frequency): the kinds'
    densities, the controls beside their kinds, and the Jensen-Shannon distance of every pair of blocks."""
    plt = pyplot()
    sigma = results["config"]["sigma"]
    states = results["states"]
    fig, axes = plt.subplots(len(states) + 1, 4, figsize=(24, 4.4 * (len(states) + 1)), squeeze=False)
    colours = {name: plt.get_cmap("tab10")(i) for i, name in enumerate(BLOCKS)}
    for r, (state, blocks) in enumerate(states.items()):
        grid = grid_of(blocks, sigma, "lambda10")
        h = heterogeneity(blocks, sigma, "lambda10")
        groups = (list(BLOCKS), [kind for kind, _ in CONTROLS.values()] + list(CONTROLS))
        for c, names in enumerate(groups):
            ax = axes[r, c]
            for name in names:
                kind = CONTROLS[name][0] if name in CONTROLS else name
                d = normalised_density(blocks[name], grid, sigma, "lambda10") / (grid[1] - grid[0])
                ax.plot(grid, np.maximum(d, 1e-12), label=name, color=colours[kind],
                        linestyle="--" if name in CONTROLS else "-")
            ax.set_yscale("log")
            ax.set_ylim(1e-6, None)
            ax.set_xlabel("eigenvalue / 10th largest eigenvalue")
            ax.set_ylabel("density")
            within = np.mean([v["within"] for v in h["controls"].values()])
            ax.set_title(f"{state}: " + (f"blocks of different kinds (mean JS {h['across']:.2f})" if c == 0 else
                                         f"one kind, two layers (mean JS {within:.2f})"), fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        names = list(BLOCKS)
        matrix = np.zeros((len(names), len(names)))
        for key, d in h["pairs"].items():
            a, b = key.split(" / ")
            i, j = names.index(a), names.index(b)
            matrix[i, j] = matrix[j, i] = d
        ax = axes[r, 2]
        layers = results["layers"][state]
        reach = max(float(np.abs(np.array(b["nodes"])).max()) / scale_of(b) for b in layers.values())
        lgrid = np.linspace(-reach - 4 * sigma, reach + 4 * sigma, 4001)
        for i, (name, block) in enumerate(layers.items()):
            d = normalised_density(block, lgrid, sigma) / (lgrid[1] - lgrid[0])
            ax.plot(lgrid, np.maximum(d, 1e-12), label=f"{name} ({block['dim']:,})",
                    color=plt.get_cmap("Dark2")(i))
        ax.set_yscale("log")
        ax.set_ylim(1e-6, None)
        ax.set_xlabel("eigenvalue / largest eigenvalue magnitude")
        ax.set_ylabel("density")
        ax.set_title(f"{state}: layer by layer (every parameter of a layer one block)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[r, 3]
        im = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if matrix[i, j] < 0.5 else "black")
        ax.set_title(f"{state}: JS distance between blocks (JS^0-style mean {h['across']:.2f})", fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046)
    precision_panels(results, axes[len(states)])
    fig.suptitle("Zhang et al. 2024, Fig. 3: blockwise Hessian spectra in units of lambda_10 (numformer "
                 "encoder-decoder, SLQ on exact products); last row: what float32 and differences of gradients cost "
                 "in precision", fontsize=10)
    return save_figure(fig, path)


def precision_panels(results: dict, axes) -> None:
    """Per state, each block's relative error of ``H v`` by float32 exact products and by central differences
    in float64 and float32, against float64's exact products (log scale); then the largest eigenvalue's."""
    ways_colours = {"exact float32": "tab:green", "differences float64": "tab:orange",
                    "differences float32": "tab:red"}
    for c, (state, blocks) in enumerate(results["precision"].items()):
        ax = axes[c]
        names = list(blocks)
        width = 0.8 / len(ways_colours)
        for i, (way, colour) in enumerate(ways_colours.items()):
            ax.bar(np.arange(len(names)) + (i - 1) * width, [max(blocks[n]["product_errors"][way], 1e-17)
                                                            for n in names], width, label=way, color=colour)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("|H v - exact float64| / |exact float64|")
        ax.set_title(f"{state}: error of H v, the worst of {results['config']['precision_directions']} directions",
                     fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    ax = axes[len(results["precision"])]
    for i, (state, blocks) in enumerate(results["precision"].items()):
        ax.scatter(np.arange(len(blocks)) + 0.2 * (2 * i - 1),
                   [max(b["top_errors"]["differences float64"], 1e-17) for b in blocks.values()],
                   label=f"{state}: differences of gradients, float64", marker="os"[i])
    ax.set_yscale("log")
    names = list(next(iter(results["precision"].values())))
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("relative error of lambda_max")
    ax.set_title("the largest eigenvalue by differences against exact products (float64; Lanczos, same start)",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    for ax in axes[len(results["precision"]) + 1:]:
        ax.axis("off")


def run(out, cfg: Config = FULL, log=print) -> dict:
    """Measure, then write ``OUT/hessian-blocks.png``, ``.md`` and ``.json``."""
    out = Path(out)
    results = measure(cfg, out / "data", log)
    return write_outputs(out, NAME, results, check, picture, table)
