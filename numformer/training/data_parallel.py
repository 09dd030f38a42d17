"""The data-parallel step's pieces (see :mod:`numformer.training.distributed`): the step's batches dealt
to the ranks, every gradient summed in one call, and rank 0's arrays broadcast at the start.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, to_host
from .distributed import World


def shard_batches(costs, size: int, rank: int) -> list[int]:
    """Indices of the batches rank ``rank`` computes, out of one step's ``size * accum`` batches.

    ``costs``: per batch, the work it stands for (padded tokens, ``B * (S + T)``). Batches
    are dealt largest first, each to the least-loaded rank that still has fewer than
    ``len(costs) / size`` (ties: the lower rank), so every rank gets the same number of
    batches and nearly the same number of tokens. The same on every rank (a pure function
    of the costs), so no rank needs to ask another. Indices come back in increasing order.
    A Python loop over the step's few batches, not over tokens.
    """
    n = len(costs)
    if n % size:
        raise ValueError(f"{n} batches cannot be dealt evenly to {size} processes")
    per = n // size
    load = [0] * size
    owned = [[] for _ in range(size)]
    for i in sorted(range(n), key=lambda i: (-costs[i], i)):
        r = min((r for r in range(size) if len(owned[r]) < per), key=lambda r: (load[r], r))
        owned[r].append(i)
        load[r] += costs[i]
    return sorted(owned[rank])


class GradientBucket:
    """All gradients of a model as views into one flat buffer, plus ``extra`` slots for step scalars.

    ``flat`` = ``[grad of params[0] (raveled), grad of params[1], ..., extra slots]``, on the
    parameters' device and dtype. Each ``Parameter.grad`` becomes a view into it, so
    backward passes accumulate straight into the buffer and one collective call sums every
    gradient (and the step's loss, in the extra slots) across ranks: no per-tensor calls,
    no copies in or out. Build it once the model is on its device (``Module.to`` allocates new
    gradients).
    """

    def __init__(self, params, extra: int = 0):
        params = list(params)
        xp = get_array_module(params[0].data)
        dtypes = {p.grad.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"gradients of several dtypes ({sorted(str(d) for d in dtypes)}) cannot share a buffer")
        self.params = params
        self.n = sum(int(p.grad.size) for p in params)
        self.flat = xp.zeros(self.n + extra, dtype=dtypes.pop())
        self.views = []
        offset = 0
        for p in params:
            view = self.flat[offset:offset + p.grad.size].reshape(p.grad.shape)
            view[...] = p.grad
            p.grad = view
            self.views.append(view)
            offset += p.grad.size
        self.extra = self.flat[self.n:]

    def rebind(self) -> None:
        """Put back any gradient a layer replaced by a new array (``p.grad = ...``) instead of adding into it."""
        for p, view in zip(self.params, self.views):
            if p.grad is not view:
                view[...] = p.grad
                p.grad = view

    def allreduce_(self, world: World, *scalars):
        """Sum every gradient and ``scalars`` (0-d arrays or numbers, at most ``extra``) over the ranks.

        The gradients are summed in place; returns the summed scalars as a host float64 array
        (the one device-to-host copy of the step).
        """
        self.rebind()
        for k, value in enumerate(scalars):
            self.extra[k] = value
        world.allreduce_sum_(self.flat)
        return to_host(self.extra[:len(scalars)]).astype(np.float64)


def broadcast_arrays_(world: World, arrays) -> None:
    """Overwrite every array of ``arrays`` (one device and dtype, each contiguous) with rank 0's.

    Packed into one buffer so that a model's hundreds of tensors cost one broadcast; used at
    start-up and after ``--resume``, never per step.
    """
    arrays = list(arrays)
    if not world.parallel or not arrays:
        return
    xp = get_array_module(arrays[0])
    flat = xp.concatenate([a.reshape(-1) for a in arrays]) if world.is_main else \
        xp.empty(sum(int(a.size) for a in arrays), dtype=arrays[0].dtype)
    world.broadcast_(flat)
    offset = 0
    for a in arrays:
        a[...] = flat[offset:offset + a.size].reshape(a.shape)
        offset += a.size
