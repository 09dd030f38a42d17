"""Pictures of a training run: ``python -m numformer.plot RUN_DIR [--out DIR]``.

Reads ``RUN_DIR/metrics.jsonl`` (and ``RUN_DIR/grad_stats.jsonl`` when training
ran with ``--log-grads``) and writes PNGs (default ``RUN_DIR/plots/``):

* ``curves.png``: train and validation loss, learning rate, validation BLEU, tokens/s;
* ``grad_flow.png``: log10 gradient norm of every parameter tensor (rows, in
  network order) over the logged steps: how gradient reaches each layer;
* ``update_ratio.png``: the size of each layer's last Adam update relative to
  its weights, per layer over steps (~1e-3 is the usual healthy range);
* ``activations.png``: std of every sub-layer output and the share of dead ReLU units.

``python -m numformer.plot --compare RUN_A RUN_B ... --out warmup.png`` puts several
runs' gradient norms, learning rates and losses side by side (the README's warmup picture).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import run_file_names
from .cli.arguments import path_argument
from .cli.front import command_line, parser
from .cli.preflight import FILE, FOLDER, check_output
from .errors import UsageError
from .file_kinds import require_run_folder, shown
from .files import atomic_write
from .picture_data import layer_of


def read_jsonl(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line a killed run cut in half, or not ours: the picture goes without it
            continue
    return [r for r in records if isinstance(r, dict)]


def pyplot():
    """matplotlib's pyplot on the Agg backend (the ``plot`` extra: pip install 'numformer[plot]')."""
    try:
        import matplotlib  # noqa: PLC0415  (an optional extra: pip install 'numformer[plot]')
    except ImportError:
        raise UsageError("the pictures are drawn with matplotlib: pip install 'numformer[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(fig, path: Path, suptitle: str = "") -> Path:
    """Lay out, write (110 dpi) and close a figure; returns ``path``."""
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    save_picture(fig, path, dpi=110)
    pyplot().close(fig)
    return path


def save_picture(fig, path, dpi: int) -> Path:
    """Write a figure through the atomic writer (a killed run never leaves half a PNG under its name); the
    format is the path's suffix (png when it has none)."""
    path = Path(path)
    atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format=path.suffix[1:].lower() or "png"), durable=False)
    return path


def plot_curves(metrics: list[dict], out: Path, title: str = "") -> Path:
    """Loss, learning rate, validation BLEU and throughput against the step."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))

    def series(key):
        rows = [(r["step"], r[key]) for r in metrics if key in r and r[key] is not None]
        return ([s for s, _ in rows], [v for _, v in rows]) if rows else ([], [])

    ax = axes[0, 0]
    for key, label in (("train_loss", "train (label-smoothed)"), ("valid_loss", "valid (label-smoothed)"),
                       ("valid_nll", "valid NLL")):
        x, y = series(key)
        if x:
            ax.plot(x, y, marker="o" if key != "train_loss" else None, ms=3, label=label)
    ax.set_title("loss per target token")
    ax.set_xlabel("step")
    ax.legend()
    ax = axes[0, 1]
    x, y = series("lr")
    ax.plot(x, y)
    ax.set_title("learning rate (Eq. 3)")
    ax.set_xlabel("step")
    ax = axes[1, 0]
    x, y = series("valid_bleu")
    ax.plot(x, y, marker="o", ms=3)
    ax.set_title("validation BLEU (greedy, subset)")
    ax.set_xlabel("step")
    ax = axes[1, 1]
    x, y = series("tokens_per_s")
    ax.plot(x, y)
    ax.set_title("target tokens per second")
    ax.set_xlabel("step")
    for a in axes.ravel():
        a.grid(alpha=0.3)
    return _save(fig, out / "curves.png", title)


def _short(name: str) -> str:
    """'decoder.layers.1.cross_attn.w_q.weight' -> 'dec.1.cross_attn.w_q.weight' (readable tick labels)."""
    return name.replace("encoder.layers.", "enc.").replace("decoder.layers.", "dec.").replace("_residual", "")


def plot_grad_flow(stats: list[dict], out: Path, title: str = "", key: str = "grad_norm") -> Path | None:
    """Heatmap: rows = parameter tensors in network order, columns = logged steps, colour = log10(key)."""
    if not stats:
        return None
    plt = pyplot()
    names = list(stats[0]["params"])
    steps = [s["step"] for s in stats]
    grid = np.array([[s["params"].get(n, {}).get(key, np.nan) for s in stats] for n in names], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        grid = np.log10(grid)
    fig, ax = plt.subplots(figsize=(max(7, 0.25 * len(steps) + 5), max(6, 0.16 * len(names) + 1.5)))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([_short(n) for n in names], fontsize=6)
    ticks = np.linspace(0, len(steps) - 1, min(len(steps), 10)).astype(int)
    ax.set_xticks(ticks)
    ax.set_xticklabels([steps[i] for i in ticks], fontsize=8)
    ax.set_xlabel("step")
    fig.colorbar(im, ax=ax, label=f"log10 {key.replace('_', ' ')}")
    ax.set_title(title or f"gradient flow: {key.replace('_', ' ')} per tensor")
    return _save(fig, out / ("grad_flow.png" if key == "grad_norm" else f"{key}.png"))


def plot_update_ratio(stats: list[dict], out: Path, title: str = "") -> Path | None:
    """Per layer: ||last Adam update|| / ||weights|| over steps (norms combined over the layer's tensors)."""
    if not stats or "update_norm" not in next(iter(stats[0]["params"].values())):
        return None
    plt = pyplot()
    layers: dict[str, list] = {}
    for n in stats[0]["params"]:
        layers.setdefault(layer_of(n), []).append(n)
    steps = [s["step"] for s in stats]
    fig, ax = plt.subplots(figsize=(9, 5))
    for layer, names in layers.items():
        ratio = []
        for s in stats:
            u = np.sqrt(sum(s["params"][n]["update_norm"] ** 2 for n in names))
            w = np.sqrt(sum(s["params"][n]["weight_norm"] ** 2 for n in names))
            ratio.append(u / w if w > 0 else np.nan)
        ax.plot(steps, ratio, label=layer)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("||update|| / ||weights||")
    ax.set_title(title or "update-to-weight ratio of the last Adam step, per layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "update_ratio.png")


def plot_activations(stats: list[dict], out: Path, title: str = "") -> Path | None:
    """Std of each sub-layer output and the dead-ReLU share over steps."""
    if not stats or not stats[0].get("activations"):
        return None
    plt = pyplot()
    steps = [s["step"] for s in stats]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for name in stats[0]["activations"]:
        axes[0].plot(steps, [s["activations"][name]["std"] for s in stats], label=_short(name))
    axes[0].set_title("std of each sub-layer output")
    axes[0].legend(fontsize=6, ncol=2)
    for name in stats[0].get("dead_relu", {}):
        axes[1].plot(steps, [100 * s["dead_relu"][name] for s in stats], label=_short(name))
    axes[1].set_title("dead ReLU units (never positive in the batch), %")
    axes[1].legend(fontsize=7)
    for a in axes:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    return _save(fig, out / "activations.png", title)


def plot_noise_scale(stats: list[dict], out: Path, title: str = "") -> Path | None:
    """The gradient noise scale B_simple (McCandlish et al. 2018) per layer type and in total over steps, and
    the batch gradient's signal-to-noise ratio (``--log-grads``: grad_stats.jsonl's "noise")."""
    rows = [s for s in stats if s.get("noise")]
    if not rows:
        return None
    plt = pyplot()
    steps = [s["step"] for s in rows]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    groups = list(rows[0]["noise"]["groups"]) + ["total"]
    for group in groups:
        def value(s, key):
            row = s["noise"]["total"] if group == "total" else s["noise"]["groups"].get(group, {})
            v = row.get(key)
            return float("nan") if v is None else v
        style = dict(color="black", linewidth=2) if group == "total" else {}
        axes[0].plot(steps, [value(s, "b_simple") for s in rows], label=group, **style)
        axes[1].plot(steps, [value(s, "snr") for s in rows], label=group, **style)
    axes[0].set_title("gradient noise scale B_simple = tr(Sigma) / |G|^2 (sentences)")
    axes[1].set_title(f"signal-to-noise ratio of the batch gradient ({rows[0]['noise']['sentences']} sentences)")
    for a in axes:
        a.set_xlabel("step")
        a.set_yscale("log")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return _save(fig, out / "noise_scale.png", title)


def plot_run(run_dir, out=None) -> list[Path]:
    """Every picture this run's files allow; returns the paths written."""
    run = Path(run_dir)
    metrics = read_jsonl(run / run_file_names.METRICS)
    if not metrics:
        raise UsageError(f"{shown(run / run_file_names.METRICS)} is missing or empty: is {shown(run)} a training run "
                         "folder?")
    out = Path(out) if out else run / "plots"
    out.mkdir(parents=True, exist_ok=True)
    stats = read_jsonl(run / run_file_names.GRAD_STATS)
    paths = [plot_curves(metrics, out, run.name)]
    paths += [p for p in (plot_grad_flow(stats, out), plot_update_ratio(stats, out), plot_activations(stats, out),
                          plot_noise_scale(stats, out)) if p is not None]
    return paths


def plot_compare(runs: list, out, title: str = "") -> Path:
    """Several runs side by side: global gradient norm, learning rate and training loss per step.

    The gradient norm comes from each run's grad_stats.jsonl (``--log-grads``), the rest from metrics.jsonl.
    Used for the warmup comparison in the README (post-LN vs pre-LN, with and without warmup).
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for run in map(Path, runs):
        stats = read_jsonl(run / run_file_names.GRAD_STATS)
        metrics = read_jsonl(run / run_file_names.METRICS)
        if not stats or not metrics:
            raise UsageError(f"{shown(run)} needs {run_file_names.GRAD_STATS} and {run_file_names.METRICS}: train it "
                             "with "
                             "--log-grads N")
        steps = [s["step"] for s in stats]
        norms = [np.sqrt(sum(r["grad_norm"] ** 2 for r in s["params"].values())) for s in stats]
        axes[0].plot(steps, norms, label=run.name)
        rows = [(r["step"], r["lr"], r["train_loss"]) for r in metrics if "train_loss" in r]
        axes[1].plot([r[0] for r in rows], [r[1] for r in rows], label=run.name)
        axes[2].plot([r[0] for r in rows], [r[2] for r in rows], label=run.name)
    axes[0].set_yscale("log")
    axes[0].set_title("global gradient norm")
    axes[1].set_title("learning rate")
    axes[2].set_title("training loss (label-smoothed)")
    for a in axes:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, out, title)


PROG = "python -m numformer.plot"


@command_line(PROG)
def main(argv=None) -> int:
    ap = parser(PROG, description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="+", type=path_argument,
                    help=f"a training run folder (with {run_file_names.METRICS}); several with --compare")
    ap.add_argument("--out", help="folder for the PNGs (default RUN/plots); with --compare, the PNG file")
    ap.add_argument("--compare", action="store_true",
                    help="one picture comparing the runs' gradient norms, learning rates and losses")
    ap.add_argument("--title", default="", help="title of the --compare picture")
    args = ap.parse_args(argv)
    if not args.compare and len(args.run) != 1:
        ap.error("give one run folder, or several with --compare")
    for run in args.run:  # a model file or a metrics log given as a run is named as what it is
        require_run_folder(run)
    if args.compare:  # the output's place is checked before anything is read or drawn
        out = check_output(args.out or "compare.png", "--out", args.run, FILE)
        paths = [plot_compare(args.run, out, args.title)]
    else:
        out = Path(args.out) if args.out else Path(args.run[0]) / "plots"
        paths = plot_run(args.run[0], check_output(out, "--out", [], FOLDER))
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
