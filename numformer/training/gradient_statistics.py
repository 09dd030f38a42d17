"""Per-layer gradient, weight, update and activation statistics during training (``train.py --log-grads N``).

:class:`GradientStatistics` is the step hook (numformer/training/step_hooks.py) that does it on every N-th
optimizer step, at the step's places:

0. ``before_forward`` of the step's first batch: the layers are tapped for the squared norm of every
   sentence's gradient of every tensor, over all the step's batches (numformer/training/per_sentence_gradients.py,
   the norms-only mode);
1. ``before_forward`` of the step's last batch, a forward tap on every residual block
   (:meth:`numformer.module.Module.tap`) and, at ``after_forward``: mean and std of every sub-layer
   output (each Residual's output) and, for each feed-forward block with ReLU, the share of dead ReLU
   units (hidden units that are not positive for any token of the batch, read from the active set the
   ReLU saved for its backward: the pieces an activation declaring ``kinks = True`` keeps, through the layer
   contract of :class:`numformer.module.Module`; SiLU is smooth, has no dead units: none is logged);
2. ``before_update`` (after backward, before Adam): per parameter tensor the gradient's L2 norm, RMS and
   largest magnitude; a copy of the weights; from the step's per-sentence gradient norms, the gradient
   noise scale and signal-to-noise ratio per tensor, per layer type and in total
   (numformer/training/gradient_noise_scale.py). With several processes they are this process's sentences; with
   loss scaling, norms and gradient are scaled alike, which the ratios cancel; TensorBoard's histograms;
3. ``after_update``: the weight norm and the norm of the update Adam just applied (new weights minus the
   copy), then one JSON line is appended to ``RUN/grad_stats.jsonl`` (``python -m numformer.plot RUN``
   draws it) and kept as :attr:`GradientStatistics.record`.

Statistics are reduced on the device; the host sees a handful of scalars per tensor.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ..backend import get_array_module, to_host
from ..layers import FeedForward, Residual
from ..module import tapped
from ..optim import sum_of_squares
from .gradient_noise_scale import noise_scales
from .per_sentence_gradients import PerSentenceGradients
from .step_hooks import StepHook


class GradientStatistics(StepHook):
    """The statistics of every ``every``-th step (see the module docstring), appended to ``path`` as JSON
    lines; TensorBoard's histograms and noise scale on the same steps when ``tensorboard`` is given."""

    def __init__(self, model, path, every: int = 1, tensorboard=None):
        self.model, self.path, self.every, self.tensorboard = model, Path(path), int(every), tensorboard
        self.params = model.named_parameters()
        self.residuals = [(n, m) for n, m in model.named_modules() if isinstance(m, Residual)]
        self.ffns = [(n, m) for n, m in model.named_modules() if isinstance(m, FeedForward)]
        self.on = False
        self.record = None          # the last line written
        self._sentences = None      # the per-sentence taps of this step, from its first forward to its update
        self._watching = None       # the residual blocks' forward taps during the step's last forward
        self._outputs = {}          # residual name -> (mean, std) of its output in that forward
        self._acts = self._grads = self._before = self._noise = None
        self._last_noise = (None, None)  # (step, the total's row) of the last logged step

    # -- the step's places (StepHook) ---------------------------------------------------------------------
    def begin(self, step, keys) -> None:
        self._stop_watching()
        self._untap()  # a step dropped after the last tap (fp16 overflow) left its taps on
        self.on = step % self.every == 0

    def before_forward(self, index, last) -> None:
        if not self.on:
            return
        if self._sentences is None:  # the step's first batch: every sentence of the step is tapped
            self._sentences = PerSentenceGradients(self.model, elementwise=False).__enter__()
        if last:
            self._watch_residuals()

    def after_forward(self, last) -> None:
        if self.on and last:
            self._activations()

    def before_update(self, step) -> None:
        if self.on:
            self._gradients()
            if self.tensorboard is not None:  # weight and gradient histograms on the same steps
                self.tensorboard.histograms(step)

    def after_update(self, step) -> None:
        if self.on:
            self.record = self._write(step)  # uses the gradient norms before_update took
            if self.tensorboard is not None and "noise" in self.record:
                self.tensorboard.noise(step, self.record["noise"])

    # -- the work -----------------------------------------------------------------------------------------
    def _watch_residuals(self) -> None:
        """A forward tap on every residual block keeping (mean, std) of its output: two reductions on the
        device, on logged steps only."""
        self._outputs = {}
        names = {id(m): n for n, m in self.residuals}

        def keep(m, forward, *args, **kwargs):
            y = forward(*args, **kwargs)
            self._outputs[names[id(m)]] = (y.mean(), y.std())
            return y
        self._watching = contextlib.ExitStack()
        self._watching.enter_context(tapped([m for _, m in self.residuals], forward=keep))

    def _stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.close()
            self._watching = None

    def noise_at(self, step: int):
        """The whole model's noise-scale row (``b_simple``, ``snr``, ...) when ``step`` was the last logged step
        and had one, else None (the trainer adds it to that step's metrics line)."""
        logged, row = self._last_noise
        return row if logged == step and row is not None and row.get("b_simple") is not None else None

    def _untap(self):
        if self._sentences is None:
            return None
        tap, self._sentences = self._sentences, None
        tap.__exit__(None, None, None)
        return tap

    def _activations(self) -> None:
        """Activation statistics of the forward just run (before its backward, in training mode)."""
        self._stop_watching()
        acts, dead = dict(self._outputs), {}
        self._outputs = {}
        for name, m in self.ffns:
            act = m.activation  # its pieces through the layer contract (Module.kinks): ReLU's active set [x > 0]
            positive = act.active_set if getattr(act, "kinks", None) is True else None  # a smooth one has none
            if positive is not None and positive.dtype == bool:
                xp = get_array_module(positive)
                ever = positive.reshape(-1, positive.shape[-1]).any(axis=0)
                dead[name] = 1.0 - ever.mean(dtype=xp.float64)
        self._acts = (acts, dead)

    def _gradients(self) -> None:
        """Gradient statistics and a copy of the weights (after backward, before the optimizer step)."""
        self._grads, self._before = {}, {}
        for name, p in self.params:
            xp = get_array_module(p.grad)
            g = p.grad.reshape(-1)
            gg = sum_of_squares(g)  # as the trainer's global norm sums them (numformer.optim.grad_norm)
            self._grads[name] = (xp.sqrt(gg), xp.sqrt(gg / max(g.size, 1)), xp.abs(g).max().astype(xp.float64))
            self._before[name] = p.data.copy()
        tap = self._untap()
        stats = tap.statistics() if tap is not None else {}
        sentences = next(iter(stats.values())).sentences if stats else 0
        self._noise = noise_scales(stats) if sentences >= 2 else None

    def _write(self, step: int) -> dict:
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
