"""What the studies share: their data (random tokens, real sentences), one gradient at a given point,
progress against the stated budget, and the table and picture files each study writes.

Every study measures on numformer's own training code (``Transformer``, ``LabelSmoothedCrossEntropy``,
``Adam``, ``Trainer``): nothing here re-implements a layer.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import numpy as np

from ..backend import get_array_module, to_host
from ..files import atomic_write_text
from ..loss import LabelSmoothedCrossEntropy
from ..optim import Adam, NoamSchedule
from ..plot import pyplot, save_picture  # noqa: F401  (pyplot: the studies draw with the one backend plot.py sets)

#: The ids below this are the vocabulary's specials (pad 0, unk 1, bos 2, eos 3): random tokens avoid them.
FIRST_ORDINARY_ID = 4


def random_batch(rng: np.random.Generator, sentences: int, length: int, vocab_size: int, bos_id: int = 2):
    """``sentences`` source and target sentences of ``length`` uniformly random ordinary tokens, no padding.

    -> (src (B, length), tgt_in (B, length), tgt_out (B, length)) int64: tgt_in is BOS then the target
    shifted right, tgt_out the target, as a training batch holds them (numformer.data.batching.Batch)."""
    src = rng.integers(FIRST_ORDINARY_ID, vocab_size, size=(sentences, length), dtype=np.int64)
    tgt = rng.integers(FIRST_ORDINARY_ID, vocab_size, size=(sentences, length), dtype=np.int64)
    tgt_in = np.concatenate([np.full((sentences, 1), bos_id, dtype=np.int64), tgt[:, :-1]], axis=1)
    return src, tgt_in, tgt


def sentence_batch(data, rng: np.random.Generator, sentences: int, max_len: int = 64, split: str = "train"):
    """``sentences`` pairs of a prepared corpus drawn at random (each side at most ``max_len`` subwords),
    padded as training pads them -> (src, tgt_in, tgt_out) int64."""
    pairs, v = data.ids[split], data.vocab
    src_len, tgt_len = pairs.lengths
    fits = np.flatnonzero((src_len <= max_len) & (tgt_len <= max_len) & (src_len > 0) & (tgt_len > 0))
    index = np.sort(rng.choice(fits, size=sentences, replace=False))
    b = pairs.batch(index, v.pad_id, v.bos_id, v.eos_id)
    return b.src, b.tgt_in, b.tgt_out


def gradient_at(model, batch, label_smoothing: float | None = None) -> float:
    """Zero the gradients, then one forward and backward of the training loss (label-smoothed
    cross-entropy, the mean over the batch's target tokens) on ``batch`` = (src, tgt_in, tgt_out).
    Leaves every ``Parameter.grad`` filled; returns the loss."""
    src, tgt_in, tgt_out = batch
    xp = model.xp
    eps = model.cfg.label_smoothing if label_smoothing is None else label_smoothing
    crit = LabelSmoothedCrossEntropy(eps, model.cfg.pad_id)
    model.train()
    model.zero_grad()
    logits = model(xp.asarray(src), xp.asarray(tgt_in))
    loss = crit.forward(logits, xp.asarray(tgt_out))
    model.backward(crit.backward())
    return float(to_host(loss))


def adam_steps(model, batches, warmup: int, lr_factor: float, watch=None, after=None,
               overwrite_logits: bool = False) -> list:
    """The studies' small training run: one step of Section 5 per (src, tgt_in, tgt_out) of ``batches``
    (forward, the label-smoothed cross-entropy of Section 5.4, backward, Adam with Eq. 3's schedule).

    ``watch(step)``: a context entered around that step's forward and backward (a tap), or None;
    ``after(step, loss, watched)``: called after the backward, before the update, with what the context
    gave. ``overwrite_logits``: the loss may reuse the logits buffer (less memory, the same numbers).
    -> every step's loss, a 0-d array on the model's device (read them once, at the end)."""
    opt = Adam(model.parameters(), schedule=NoamSchedule(model.cfg.d_model, warmup, lr_factor))
    crit = LabelSmoothedCrossEntropy(model.cfg.label_smoothing, model.cfg.pad_id)
    xp, losses = model.xp, []
    model.train()
    model.zero_grad()
    for step, (src, tgt_in, tgt_out) in enumerate(batches, start=1):
        context = watch(step) if watch is not None else None
        with context if context is not None else contextlib.nullcontext() as watched:
            loss = crit.forward(model(xp.asarray(src), xp.asarray(tgt_in)), xp.asarray(tgt_out),
                                overwrite_logits=overwrite_logits)
            model.backward(crit.backward())
        losses.append(loss)
        if after is not None:
            after(step, loss, watched)
        opt.step(zero_grad=True)
    return losses


def param_norm(p, grad: bool = True) -> float:
    """L2 norm of a parameter's gradient (or of its weights), summed in float64."""
    a = (p.grad if grad else p.data).reshape(-1)
    xp = get_array_module(a)
    return float(to_host(xp.sqrt(xp.vdot(a, a).astype(xp.float64))))


def bible_data(folder, log=print, vocab_size: int | None = None):
    """The ``bible-en-es`` corpus prepared into ``folder`` (vocabulary and encoded splits), built from the
    installed SWORD modules on first use and reused after (numformer.prepare). ``vocab_size``: None for
    the corpus's default (8,000 pieces), else that many, in ``folder/vN`` (so both can be kept)."""
    from ..data.prepared_dataset import prepare  # noqa: PLC0415  (only the studies that use real sentences need it)

    folder = Path(folder) if vocab_size is None else Path(folder) / f"v{vocab_size}"
    return prepare(folder, corpus="bible-en-es", vocab_size=vocab_size, log=lambda line: log(f"data: {line}"))


class Budget:
    """Progress of a study against the time its docstring states, one line per piece of work:
    ``[name] 3/24 xavier post-LN seed 1 | 0.6 min, ~1.2 min left (stated: at most 6 min on 2 cores)``.
    ``units`` is the total work; each :meth:`step` adds ``weight`` of it (e.g. the layers of a model)."""

    def __init__(self, name: str, units: float, minutes: float, log=print):
        self.name, self.units, self.minutes, self.log = name, max(units, 1), minutes, log
        self.done, self.pieces = 0.0, 0
        self.start = time.perf_counter()

    def step(self, what: str = "", weight: float = 1) -> None:
        self.done += weight
        self.pieces += 1
        spent = time.perf_counter() - self.start
        left = spent / self.done * max(self.units - self.done, 0)
        self.log(f"[{self.name}] {self.pieces} {what} | {100 * self.done / self.units:.0f}% of the work, "
                 f"{spent / 60:.1f} min, ~{left / 60:.1f} min left (stated: at most {self.minutes:g} min on 2 cores)")

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def markdown_table(header: list, rows: list) -> str:
    """A GitHub-markdown table; floats get 3 significant digits."""
    def cell(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_outputs(out, name: str, results: dict, check, picture, table) -> dict:
    """A study's verdict and files from its measured ``results``: ``results["failed"]`` (``check``'s list of
    the claims that did not hold), ``OUT/NAME.png`` (``picture``), ``OUT/NAME.md`` (``table``: the claim beside
    the measurement) and ``OUT/NAME.json`` (every number measured); their paths in ``results["files"]``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results["failed"] = check(results)
    png, md, js = out / f"{name}.png", out / f"{name}.md", out / f"{name}.json"
    results["files"] = [str(picture(results, png)), str(md), str(js)]
    atomic_write_text(md, table(results))
    atomic_write_text(js, json.dumps(results, indent=1) + "\n")
    return results


def save_figure(fig, path) -> Path:
    """Lay out, write and close a study's figure; -> its path."""
    fig.tight_layout()
    path = Path(path)
    save_picture(fig, path, dpi=110)
    pyplot().close(fig)
    return path

