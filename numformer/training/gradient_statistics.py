"""Per-layer gradient, weight, update and activation statistics during training (``train.py --log-grads N``).

On every N-th optimizer step the trainer calls, in order:

0. :meth:`GradStats.tap` before the step's first forward: the layers are tapped for the
   squared norm of every sentence's gradient of every tensor, over all the step's batches
   (numformer/training/per_sentence.py, the norms-only mode);
1. :meth:`GradStats.start` before the step's last forward, and
   :meth:`GradStats.after_forward` between that forward and its backward:
   mean and std of every sub-layer output (each Residual's output) and, for each
   feed-forward block with ReLU, the share of dead ReLU units (hidden units that are not
   positive for any token of the batch; SiLU has no dead units: none is logged);
2. :meth:`GradStats.before_step` after backward, before Adam: per parameter
   tensor the gradient's L2 norm, RMS and largest magnitude; a copy of the weights;
   from the step's per-sentence gradient norms, the gradient noise scale and
   signal-to-noise ratio per tensor, per layer type and in total
   (numformer/training/noise_scale.py). With several processes they are this process's
   sentences; with loss scaling, norms and gradient are scaled alike, which the ratios cancel;
3. :meth:`GradStats.after_step`: the weight norm and the norm of the update Adam
   just applied (new weights minus the copy), then one JSON line is appended to
   ``RUN/grad_stats.jsonl`` (``python -m numformer.plot RUN`` draws it).

Statistics are reduced on the device; the host sees a handful of scalars per tensor.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..backend import get_array_module, to_host
from ..layers import FeedForward, Residual
from .gradient_noise_scale import noise_scales
from .per_sentence_gradients import PerSentenceGradients


class GradStats:
    """Collects the statistics of one logged step and appends them to a JSON-lines file."""

    def __init__(self, model, path):
        self.model = model
        self.path = Path(path)
        self.params = model.named_parameters()
        self.residuals = [(n, m) for n, m in model.named_modules() if isinstance(m, Residual)]
        self.ffns = [(n, m) for n, m in model.named_modules() if isinstance(m, FeedForward)]
        self._acts = None
        self._grads = None
        self._before = None
        self._tap = None
        self._noise = None
        self._last_noise = (None, None)  # (step, the total's row) of the last logged step

    def tap(self) -> None:
        """Tap the layers for the norms of every sentence's gradient in this step's backwards (the gradients
        are zero: the last update zeroed them)."""
        self._untap()  # a step dropped after the last tap left its taps on
        self._tap = PerSentenceGradients(self.model, elementwise=False).__enter__()

    def start(self) -> None:
        """Ask every residual block to keep its output statistics during the next forward."""
        for _, m in self.residuals:
            m.record_stats = True

    def noise_at(self, step: int):
        """The whole model's noise-scale row (``b_simple``, ``snr``, ...) when ``step`` was the last logged step
        and had one, else None (the trainer adds it to that step's metrics line)."""
        logged, row = self._last_noise
        return row if logged == step and row is not None and row.get("b_simple") is not None else None

    def _untap(self):
        if self._tap is None:
            return None
        tap, self._tap = self._tap, None
        tap.__exit__(None, None, None)
        return tap

    def after_forward(self) -> None:
        """Activation statistics of the forward just run (before its backward, in training mode)."""
        acts, dead = {}, {}
        for name, m in self.residuals:
            if m.output_stats is not None:
                acts[name] = m.output_stats
            m.record_stats, m.output_stats = False, None
        for name, m in self.ffns:
            positive = getattr(m.activation, "active_set", None)  # ReLU's [x > 0]; SiLU keeps none
            if positive is not None:
                xp = get_array_module(positive)
                ever = positive.reshape(-1, positive.shape[-1]).any(axis=0)
                dead[name] = 1.0 - ever.mean(dtype=xp.float64)
        self._acts = (acts, dead)

    def before_step(self) -> None:
        """Gradient statistics and a copy of the weights (after backward, before the optimizer step)."""
        self._grads, self._before = {}, {}
        for name, p in self.params:
            xp = get_array_module(p.grad)
            g = p.grad.reshape(-1)
            gg = xp.vdot(g, g).astype(xp.float64)
            self._grads[name] = (xp.sqrt(gg), xp.sqrt(gg / max(g.size, 1)), xp.abs(g).max().astype(xp.float64))
            self._before[name] = p.data.copy()
        tap = self._untap()
        stats = tap.statistics() if tap is not None else {}
        sentences = next(iter(stats.values())).sentences if stats else 0
        self._noise = noise_scales(stats) if sentences >= 2 else None

    def after_step(self, step: int) -> dict:
        """Weight and update norms; appends the line for ``step`` to the file and returns it."""
        rows = {}
        for name, p in self.params:
            xp = get_array_module(p.data)
            w = p.data.reshape(-1)
            delta = w - self._before[name].reshape(-1)
            values = to_host(xp.stack([*self._grads[name], xp.sqrt(xp.vdot(w, w).astype(xp.float64)),
                                       xp.sqrt(xp.vdot(delta, delta).astype(xp.float64))]))
            gn, grms, gmax, wn, un = (float(v) for v in values)
            rows[name] = {"grad_norm": gn, "grad_rms": grms, "grad_max": gmax, "weight_norm": wn,
                          "update_norm": un, "update_ratio": un / wn if wn > 0 else 0.0}
        record = {"step": int(step), "params": rows}
        if self._acts is not None:
            acts, dead = self._acts
            record["activations"] = {n: {"mean": float(to_host(m)), "std": float(to_host(s))}
                                     for n, (m, s) in acts.items()}
            record["dead_relu"] = {n: float(to_host(v)) for n, v in dead.items()}
        if self._noise is not None:
            record["noise"] = noise_record(self._noise)
            self._last_noise = (int(step), record["noise"]["total"])
        self._acts = self._grads = self._before = self._noise = None
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return record


def noise_record(noise: dict) -> dict:
    """The noise scales as JSON: per tensor, per layer type and in total, ``b_simple``, ``snr``, ``grad_sq``
    and ``trace`` (None where an estimate is undefined: a non-positive ``|G|^2`` or ``tr(Sigma)``)."""
    def row(est):
        return {k: (None if v != v else v) for k, v in (("b_simple", est.b_simple), ("snr", est.snr),
                                                         ("grad_sq", est.grad_sq), ("trace", est.trace))}
    return {"sentences": noise["total"].sentences, "total": row(noise["total"]),
            "groups": {g: row(e) for g, e in noise["groups"].items()},
            "tensors": {n: row(e) for n, e in noise["tensors"].items()}}
