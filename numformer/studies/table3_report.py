"""table3's report: the Markdown table (``OUT/table3.md``) that puts the dev PPL and BLEU of Table 3
(Vaswani et al. 2017, Section 6.2) beside numformer's mean over seeds and min..max, with a line per group
saying whether the paper's direction held, and the picture (``OUT/table3.png``): per row, PPL relative to base
and BLEU minus base's, the paper's bar beside numformer's.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..presets import PAPER_COLUMNS, TABLE3
from .common import pyplot, save_figure
from .table3_compare import EFFECTIVE, GROUP_CLAIMS, check, directions, effective, summary
from .table3_config import CITATION, TITLE


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
