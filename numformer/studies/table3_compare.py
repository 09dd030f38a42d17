"""table3's comparison with the paper: each row's results summarised over seeds, each group's direction of
Table 3 (Vaswani et al. 2017, Section 6.2) judged, and the integrity check that the runs are what the rows say.

:func:`summary` gives each row's mean and min..max over seeds of dev PPL and BLEU. :func:`directions` judges,
on dev PPL as the paper words them, (A) one head against the best head count, (B) each smaller d_k against
base, (C) each size column falling as it grows, (D) no dropout against base and label smoothing raising PPL,
(E) learned positions about equal to the sinusoids: "held", "reversed", or "inside the seed spread" (the
difference of the means no larger than the larger of the two rows' min..max ranges). :func:`check` fails on
integrity only (a row built unlike its row, a parameter count unlike its config's, two rows measured exactly
alike, a run without a result): a direction that does not hold is a result, not a failure.
"""
from __future__ import annotations

import numpy as np

from ..presets import TABLE3, ModelConfig, count_parameters

#: Row E's direction ("about equal"): held when learned is within the seed spread of base or this close.
E_TOLERANCE = 0.02

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
