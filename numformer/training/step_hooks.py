"""What hangs on a training step besides its five lines: the optional work, one hook each.

:meth:`numformer.training.trainer.Trainer.train_step` is Section 5's step (forward, loss, backward,
clip, Adam step). Everything a particular run adds to it is a :class:`StepHook`, called at fixed
places of the step by :class:`StepHooks`:

====================  ======================================================================  =========================
hook                  what it does                                                            when it is on
====================  ======================================================================  =========================
``BatchDropoutKeys``  reseeds the dropout masks before each batch from its data position      ``--dropout-rng batch``, several processes
``GradientAllReduce`` sums gradients, loss and NLL over the processes (one buffer per step)  several processes
``LossScaling``       seeds backward with ``scale * dL/dlogits``, unscales the gradients,     ``--precision fp16``
                      skips an overflowing step and halves the scale
``GradientStatistics`` per-tensor gradient, weight, update and activation statistics, and    ``--log-grads N``, every N-th step
                      TensorBoard's histograms (numformer/training/gradient_statistics.py)
====================  ======================================================================  =========================

The places, in the order a step reaches them::

    begin(step, keys)             before the first batch (step: the number the step will have)
    before_forward(i, last)       each batch of this process (i: its index in the step, last: the last one)
    after_forward(last)
    seed_backward(dlogits)        -> the array backward starts from
    after_backward(loss, nll)     -> (loss, nll): after every batch's backward, before the norm
    verdict(loss, gnorm)          -> a StepStatus, or None to leave it to the finite check
    before_update(step)           the step is good: before Adam
    after_update(step)            after Adam

A hook overrides only the places it needs; the others do nothing.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class StepStatus(enum.Enum):
    """How an optimizer step ended."""

    OK = "ok"                # Adam updated the weights
    OVERFLOW = "overflow"    # fp16: the scaled gradient overflowed, the scale halved; the next batches redo the step
    NONFINITE = "nonfinite"  # a non-finite loss or gradient norm: no update, the step is skipped


@dataclass
class StepResult:
    """One optimizer step: the loss per target token and the gradient norm (host floats), the summed NLL
    (on the device), the target tokens of every batch of the step, and how it ended."""

    loss: float
    nll_sum: object
    tokens: int
    grad_norm: float
    status: StepStatus


class StepHook:
    """One piece of optional work on a training step; every place does nothing unless overridden."""

    def begin(self, step: int, keys) -> None:
        pass

    def before_forward(self, index: int, last: bool) -> None:
        pass

    def after_forward(self, last: bool) -> None:
        pass

    def seed_backward(self, dlogits):
        return dlogits

    def after_backward(self, loss, nll):
        return loss, nll

    def verdict(self, loss: float, grad_norm: float) -> StepStatus | None:
        return None

    def before_update(self, step: int) -> None:
        pass

    def after_update(self, step: int) -> None:
        pass


class StepHooks(StepHook):
    """The hooks of a run, called in the order given (``None`` entries, hooks that are off, are dropped)."""

    def __init__(self, *hooks):
        self.hooks = [h for h in hooks if h is not None]

    def begin(self, step, keys):
        for h in self.hooks:
            h.begin(step, keys)

    def before_forward(self, index, last):
        for h in self.hooks:
            h.before_forward(index, last)

    def after_forward(self, last):
        for h in self.hooks:
            h.after_forward(last)

    def seed_backward(self, dlogits):
        for h in self.hooks:
            dlogits = h.seed_backward(dlogits)
        return dlogits

    def after_backward(self, loss, nll):
        for h in self.hooks:
            loss, nll = h.after_backward(loss, nll)
        return loss, nll

    def verdict(self, loss, grad_norm):
        for h in self.hooks:
            status = h.verdict(loss, grad_norm)
            if status is not None:
                return status
        return None

    def before_update(self, step):
        for h in self.hooks:
            h.before_update(step)

    def after_update(self, step):
        for h in self.hooks:
            h.after_update(step)


def finite_status(loss: float, grad_norm: float) -> StepStatus:
    """The check every step gets: a non-finite loss or gradient norm skips the step."""
    return StepStatus.OK if math.isfinite(loss) and math.isfinite(grad_norm) else StepStatus.NONFINITE


class BatchDropoutKeys(StepHook):
    """Dropout masks as a function of the batch, not of the process that computes it: before each batch
    the model's generator is reseeded from (run seed, epoch, position of the batch in the epoch)."""

    def __init__(self, model, seed: int):
        self.model, self.seed, self.keys = model, seed, None

    def begin(self, step, keys):
        self.keys = keys

    def before_forward(self, index, last):
        if self.keys is not None:
            self.model.rng.set_state({"seed": dropout_seed(self.seed, *self.keys[index])})


def dropout_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of the dropout masks of batch ``position`` of ``epoch`` in a run seeded ``seed``.

    A function of the batch alone (not of the process that computes it, nor of the step it
    falls in), so data parallelism and gradient accumulation see the same masks. SeedSequence
    mixes the three numbers into well-spread bits; 63 of them fit every generator's seed.
    """
    # SeedSequence is host integer hashing, not array math: numpy is the right tool on any device.
    return int(np.random.SeedSequence([seed, epoch, position]).generate_state(1, np.uint64)[0] >> 1)


class GradientAllReduce(StepHook):
    """Several processes: every gradient is a view into the parameter buffer's gradient array (two spare
    slots carry the loss and the NLL), summed over the processes in place (GradientBucket); from here on every
    rank holds the same sums."""

    def __init__(self, world, bucket):
        self.world, self.bucket = world, bucket

    def after_backward(self, loss, nll):
        return self.bucket.allreduce_(self.world, loss, nll)


class LossScaling(StepHook):
    """fp16 GEMMs (:mod:`numformer.training.loss_scaling`): backward starts from ``scale * dL/dlogits``;
    the summed gradients are unscaled before their norm is taken or clipped; an overflow skips the step."""

    def __init__(self, scaler, params):  # params: the ParameterBuffer (or Parameters)
        self.scaler, self.params = scaler, params

    def seed_backward(self, dlogits):
        return self.scaler.scale_grad_(dlogits)

    def after_backward(self, loss, nll):
        self.scaler.unscale_(self.params)  # the true gradient (after the all-reduce: every rank's sum)
        return loss, nll

    def verdict(self, loss, grad_norm):
        if not math.isfinite(loss):
            return None  # a non-finite loss is not an fp16 overflow: the finite check skips the step
        if not self.scaler.update(found_nonfinite=not math.isfinite(grad_norm)):
            return StepStatus.OK
        # overflow: the scale was halved, a normal event; at the smallest scale it is a real failure
        return StepStatus.NONFINITE if self.scaler.exhausted else StepStatus.OVERFLOW
