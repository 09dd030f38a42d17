"""Per-layer gradient, weight, update and activation statistics during training (``train.py --log-grads N``).

On every N-th optimizer step the trainer calls, in order:

1. :meth:`GradStats.start` before the step's last forward, and
   :meth:`GradStats.after_forward` between that forward and its backward:
   mean and std of every sub-layer output (each Residual's output) and, for each
   feed-forward block, the share of dead ReLU units (hidden units that are not
   positive for any token of the batch);
2. :meth:`GradStats.before_step` after backward, before Adam: per parameter
   tensor the gradient's L2 norm, RMS and largest magnitude; a copy of the weights;
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

    def start(self) -> None:
        """Ask every residual block to keep its output statistics during the next forward."""
        for _, m in self.residuals:
            m.record_stats = True

    def after_forward(self) -> None:
        """Activation statistics of the forward just run (before its backward, in training mode)."""
        acts, dead = {}, {}
        for name, m in self.residuals:
            if m.output_stats is not None:
                acts[name] = m.output_stats
            m.record_stats, m.output_stats = False, None
        for name, m in self.ffns:
            positive = m.relu.active_set
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
        self._acts = self._grads = self._before = None
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return record
