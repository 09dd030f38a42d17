"""Adam with the paper's settings, the warmup schedule and gradient clipping (Section 5.3).

Adam (Kingma & Ba) with beta1 = 0.9, beta2 = 0.98, eps = 1e-9, written exactly as
``torch.optim.Adam`` computes it so the two can be compared to 1e-9:
``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
``p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.

Schedule (Eq. 3): ``lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``,
with ``step`` counted once per optimizer step (starting at 1), shared by every parameter.
"""
from __future__ import annotations

import math

import numpy as np

from .backend import get_array_module, to_host, to_xp
from .kernels import kernel

def adam_update(params, grads, ms, vs, step_size: float, b1: float, b2: float, bc2_sqrt: float, eps: float,
                zero_grad: bool = False) -> None:
    """One Adam step of every tensor, in place (lists of arrays of matching shapes).

    ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
    ``p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)``, with ``step_size = lr / (1 - b1^t)``
    and ``bc2_sqrt = sqrt(1 - b2^t)``. ``zero_grad``: then set g = 0.
    """
    for p, g, m, v in zip(params, grads, ms, vs):
        m[...] = b1 * m + (1.0 - b1) * g
        v[...] = b2 * v + (1.0 - b2) * (g * g)
        p -= step_size * (m / (get_array_module(v).sqrt(v) / bc2_sqrt + eps))
        if zero_grad:
            g[...] = 0


class NoamSchedule:
    """Eq. 3: linear warmup for ``warmup`` steps, then decay with the inverse square root of the step."""

    def __init__(self, d_model: int, warmup: int = 4000, factor: float = 1.0):
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 step, got {warmup}")
        self.d_model, self.warmup, self.factor = d_model, warmup, factor

    def __call__(self, step: int) -> float:
        step = max(int(step), 1)
        return self.factor * self.d_model ** -0.5 * min(step ** -0.5, step * self.warmup ** -1.5)


def grad_norm(params):
    """Global L2 norm of all gradients, a 0-d float64 array on the gradients' device (no host sync).

    One BLAS dot product per tensor (``vdot(g, g)``), summed in float64: no squared copy of
    every gradient. A non-finite gradient anywhere makes the norm non-finite.
    """
    xp = get_array_module(params[0].grad)
    total = xp.zeros((), dtype=xp.float64)
    for p in params:
        g = p.grad.reshape(-1)
        total = total + xp.vdot(g, g).astype(xp.float64)
    return xp.sqrt(total)


def clip_grad_norm(params, max_norm: float):
    """Scale all gradients so their global L2 norm is at most ``max_norm``; returns the norm before clipping.

    ``max_norm`` 0 (or less) clips nothing: the norm alone (the paper does not clip). The norm stays on the
    device (a 0-d array) so clipping does not force a host sync.
    """
    params = list(params)
    if not params:
        return 0.0
    if max_norm <= 0:
        return grad_norm(params)
    xp = get_array_module(params[0].grad)
    total = grad_norm(params)
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0).astype(params[0].grad.dtype)
    for p in params:
        p.grad *= scale
    return total


class Adam:
    """Adam over a list of Parameters, lr from a schedule (callable of the step) or a constant."""

    def __init__(self, params, lr=None, betas=(0.9, 0.98), eps: float = 1e-9, schedule=None):
        if (lr is None) == (schedule is None):
            raise ValueError("give exactly one of lr (a constant) or schedule (a callable of the step)")
        self.params = list(params)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.schedule = schedule if schedule is not None else (lambda step: lr)
        self.step_count = 0  # optimizer steps taken; the schedule and bias correction use it
        self.m = [get_array_module(p.data).zeros_like(p.data) for p in self.params]
        self.v = [get_array_module(p.data).zeros_like(p.data) for p in self.params]

    @property
    def lr(self) -> float:
        """The learning rate the *next* step will use."""
        return self.schedule(self.step_count + 1)

    def step(self, zero_grad: bool = False) -> float:
        """One update of every parameter from its ``grad``; returns the learning rate used.

        ``zero_grad=True`` also zeroes every gradient: the same result as ``step(); zero_grad()``
        (the fast kernel zeroes each block while it is in cache, saving a second pass).
        """
        self.step_count += 1
        t = self.step_count
        lr = self.schedule(t)
        kernel(adam_update)([p.data for p in self.params], [p.grad for p in self.params], self.m, self.v,
                            lr / (1.0 - self.beta1 ** t), self.beta1, self.beta2, math.sqrt(1.0 - self.beta2 ** t),
                            self.eps, zero_grad)
        return lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.zero_grad()

    def state_dict(self) -> dict:
        """Host numpy moments and the step counter (portable, like model checkpoints)."""
        return {
            "step_count": self.step_count,
            "m": [np.array(to_host(a)) for a in self.m],
            "v": [np.array(to_host(a)) for a in self.v],
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["m"]) != len(self.params):
            raise ValueError(f"optimizer state holds {len(state['m'])} tensors, the model has {len(self.params)}")
        self.step_count = int(state["step_count"])
        for i, p in enumerate(self.params):
            xp = get_array_module(p.data)
            self.m[i] = to_xp(state["m"][i], xp, p.data.dtype).copy()
            self.v[i] = to_xp(state["v"][i], xp, p.data.dtype).copy()
