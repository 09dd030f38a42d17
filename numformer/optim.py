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

from .backend import get_array_module, parallel_tasks, to_host, to_xp

# Elements per block of the host update. Each block costs a dozen ufunc calls, so blocks must
# be big enough for that overhead to vanish yet small enough for the passes to stay in cache.
# Measured (base, 52M parameters, 2 threads): 1<<15 136 ms, 1<<16 106 ms, 1<<17 88 ms,
# 1<<18 87 ms, 1<<19 96 ms, 1<<22 104 ms.
ADAM_BLOCK = 1 << 17


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

    The norm stays on the device (a 0-d array) so clipping does not force a host sync.
    """
    params = list(params)
    if not params:
        return 0.0
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

        ``zero_grad=True`` also zeroes each gradient block right after its update has read
        it, while it is still in cache: the same result as ``step(); zero_grad()`` without
        a second pass over every gradient (base, 2 threads: 116 -> 99 ms for update and zeroing).
        """
        self.step_count += 1
        t = self.step_count
        lr = self.schedule(t)
        b1, b2 = self.beta1, self.beta2
        step_size = lr / (1.0 - b1 ** t)
        bc2_sqrt = math.sqrt(1.0 - b2 ** t)
        eps = self.eps

        def update(pc, gc, mc, vc):
            xp = get_array_module(pc)
            tmp = xp.multiply(gc, 1.0 - b1)
            mc *= b1
            mc += tmp
            xp.multiply(gc, gc, out=tmp)
            tmp *= 1.0 - b2
            vc *= b2
            vc += tmp
            xp.sqrt(vc, out=tmp)
            tmp /= bc2_sqrt
            tmp += eps
            xp.divide(mc, tmp, out=tmp)
            tmp *= step_size
            pc -= tmp
            if zero_grad:
                gc.fill(0)

        tasks, sizes = [], []
        for p, m, v in zip(self.params, self.m, self.v):
            arrays = (p.data, p.grad, m, v)
            # blocks only on the host (cache-sized passes, spread over threads); on a GPU one
            # set of kernels per tensor, since thousands of small launches would cost more
            if (get_array_module(p.data) is np and all(a.flags.c_contiguous for a in arrays)
                    and p.data.size > ADAM_BLOCK):
                flat = [a.reshape(-1) for a in arrays]  # views: contiguous
                for i in range(0, p.data.size, ADAM_BLOCK):
                    tasks.append(tuple(f[i:i + ADAM_BLOCK] for f in flat))
                    sizes.append(min(ADAM_BLOCK, p.data.size - i))
            else:
                tasks.append(arrays)
                sizes.append(p.data.size)
        parallel_tasks(update, tasks, sizes)
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
