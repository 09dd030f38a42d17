"""Dynamic loss scaling for fp16 GEMMs (Micikevicius et al. 2018, "Mixed Precision Training").

Used by training only when ``--precision fp16`` is set (:mod:`numformer.precision`); fp32 and tf32 keep
float32's range and need no scaler. The trainer hangs it on the step as a hook
(:class:`numformer.training.step_hooks.LossScaling`).
"""
from __future__ import annotations

import math

from ..parameter_buffer import gradient_arrays

class DynamicLossScaler:
    """Dynamic loss scaling for fp16 GEMMs (Micikevicius et al. 2018; ``torch.cuda.amp.GradScaler``).

    Gradients of a Transformer are often below float16's smallest subnormal (6e-8) and
    would round to zero when a GEMM casts them. Backward is therefore seeded with the loss
    gradient times ``scale`` (a power of two: scaling and unscaling are exact in binary
    floating point), which lifts every gradient by the same factor; the parameter
    gradients (float32) are divided by ``scale`` before anything reads them. If the
    scaled gradients overflowed float16 (inf or nan somewhere), the step is skipped and
    ``scale`` halves; after ``growth_interval`` consecutive good steps it doubles.

    Host state only (Python floats): nothing here forces a device sync. The one finite
    check is the trainer's own (``math.isfinite(float(gnorm))`` on the global grad norm).

    How the trainer uses it, per optimizer step (fp16 mode only: fp32 and tf32 keep
    float32's range and need no scaler)::

        set_matmul_precision("fp16", device)          # once, before training
        scaler = DynamicLossScaler()                  # or load_state_dict(...) on resume

        for batch in step_batches:                     # forward/backward as before
            loss = crit.forward(model(src, tgt_in), tgt_out, normalizer=n_tokens)  # true loss
            model.backward(scaler.scale_grad_(crit.backward()))  # seed backward with scale * dL/dlogits
        scaler.unscale_(params)                        # true gradients, before norm and clipping
        gnorm = clip_grad_norm(params, clip)           # or grad_norm(params)
        loss_ok = math.isfinite(float(loss))
        if scaler.update(found_nonfinite=not math.isfinite(float(gnorm))):
            optimizer.zero_grad()                      # overflow: skip the step (scale was halved);
            ...                                        # not a training failure, unless not loss_ok
        else:                                          # or scaler.exhausted
            optimizer.step(); optimizer.zero_grad()

    * The reported loss is the true one: only the gradient is scaled, not the loss value.
    * A skipped step does not move Adam's step counter (so not the schedule either) and
      is not a training failure. It is one when the loss itself is non-finite (the
      forward pass overflowed or diverged: scaling cannot help) or when
      :attr:`exhausted` is set (overflow even at ``min_scale``).
    * With several processes, unscale and check after the gradients are summed, so every
      rank takes the same decision and keeps the same scale.
    * Checkpoint :meth:`state_dict` next to the optimizer's; a resumed run continues
      with the same scale.

    (Why ``scale_grad_`` multiplies the loss gradient instead of dividing the loss's
    ``normalizer`` by the scale: :class:`~numformer.loss.LabelSmoothedCrossEntropy` clamps the
    normalizer to at least 1, and would report a scaled loss.)
    """

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 2.0 ** -14, max_scale: float = 2.0 ** 24):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("loss scaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                             "growth_interval >= 1")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)  # beyond 2**24, 1/scale nears float32's subnormals
        self.good_steps = 0       # consecutive finite steps since the last change of scale
        self.skipped_steps = 0    # overflow steps skipped in all
        self.exhausted = False    # an overflow at min_scale: not a scaling problem

    def scale_grad_(self, dloss):
        """Multiply backward's seed (dL/dlogits, (..., vocab)) by ``scale`` in place; returns it."""
        dloss *= self.scale  # a Python float: the array keeps its dtype (float32), no host sync
        return dloss

    def unscale_(self, params) -> None:
        """Divide every gradient by ``scale`` in place (exact while the scale is a power of two). ``params``: a
        ParameterBuffer (its whole gradient arrays, a few operations) or Parameters (one per tensor)."""
        inv = 1.0 / self.scale
        for g in gradient_arrays(params):
            g *= inv

    def update(self, found_nonfinite: bool) -> bool:
        """After unscaling and the finite check: adjust the scale; True when the step must be skipped.

        Overflow: ``scale *= backoff_factor`` (not below ``min_scale``; at it, :attr:`exhausted`
        is set), the good-step count restarts, and the step is to be skipped. Otherwise the
        good-step count grows, and every ``growth_interval`` of them ``scale *= growth_factor``
        (up to ``max_scale``).
        """
        if found_nonfinite:
            self.exhausted = self.scale <= self.min_scale
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return True
        self.exhausted = False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0
        return False

    def state_dict(self) -> dict:
        """Plain Python numbers (JSON-safe, portable across devices)."""
        return {"scale": self.scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale, "max_scale": self.max_scale,
                "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        scale = float(state["scale"])
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"loss scaler state holds an invalid scale {state['scale']!r}")
        self.scale = scale
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.min_scale = float(state.get("min_scale", self.min_scale))
        self.max_scale = float(state.get("max_scale", self.max_scale))
        self.good_steps = int(state.get("good_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.exhausted = False

    def __repr__(self) -> str:
        return f"DynamicLossScaler(scale={self.scale:g}, good_steps={self.good_steps}, skipped={self.skipped_steps})"
