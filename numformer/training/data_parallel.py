"""The data-parallel step's pieces (see :mod:`numformer.training.distributed`): the step's batches dealt
to the ranks, every gradient summed in place on the parameter buffer's gradient array (in measured pieces on
the host, one call on a device), and rank 0's arrays broadcast at the start.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module, is_cupy_array, to_host
from ..parameter_buffer import SPARE_SLOTS, ParameterBuffer
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


#: Elements of a host gradient buffer summed in one MPI call. Open MPI on two processes of one 2-core AMD EPYC
#: (bench/data_parallel.py --allreduce N --bucket-elements K): base's 52M float32 in one call 114-125 ms, in
#: pieces of 2^21 39 ms, 2^20 35-38 ms, 2^19 32 ms, 2^18 32 ms, 2^16 37 ms; small's 7.6M: 7.8 ms, 6.0 ms at 2^19.
HOST_BUCKET_ELEMENTS = 1 << 19


class GradientBucket:
    """The gradients every rank sums: the model's parameter buffer's gradient arrays
    (:mod:`numformer.parameter_buffer`), with the step's scalars (loss, NLL) in their spare slots.

    Backward passes accumulate straight into the buffer (every ``Parameter.grad`` is a view into it), so the
    collective calls sum every gradient and the scalars across ranks in place: no per-tensor calls, no copies
    in or out. A host buffer goes in consecutive pieces of ``bucket_elements`` (one call each: measured 3.5x
    faster than one call for base, :data:`HOST_BUCKET_ELEMENTS`); a device buffer in one call per dtype (NCCL
    pipelines a large message itself; each call would be a launch). ``params``: the buffer, or Parameters
    (packed into their buffer, :meth:`ParameterBuffer.of`). ``extra``: how many scalars ride along (at most
    :data:`~numformer.parameter_buffer.SPARE_SLOTS`).
    """

    def __init__(self, params, extra: int = 0, bucket_elements: int = HOST_BUCKET_ELEMENTS):
        self.buffer = params if isinstance(params, ParameterBuffer) else ParameterBuffer.of(params)
        if extra > SPARE_SLOTS:
            raise ValueError(f"at most {SPARE_SLOTS} scalars ride along with the gradients, not {extra}")
        self.extra, self.bucket_elements = extra, bucket_elements

    def pieces(self, flat) -> list:
        """The consecutive views of ``flat`` summed one call each (the whole of a device array)."""
        if is_cupy_array(flat):
            return [flat]
        return [flat[i:i + self.bucket_elements] for i in range(0, flat.size, self.bucket_elements)]

    def allreduce_(self, world: World, *scalars):
        """Sum every gradient and ``scalars`` (0-d arrays or numbers, at most ``extra``) over the ranks.

        The gradients are summed in place; returns the summed scalars as a host float64 array
        (the one device-to-host copy of the step). A gradient some layer replaced by a new array instead
        of adding into it would not be summed: that bug raises ParameterRebound here.
        """
        if len(scalars) > self.extra:
            raise ValueError(f"{len(scalars)} scalars given, the bucket carries {self.extra}")
        self.buffer.check()
        groups = self.buffer.groups
        for k, value in enumerate(scalars):
            groups[0].spare[k] = value
        for group in groups:
            for piece in self.pieces(group.grad_and_spare):
                world.allreduce_sum_(piece)
        return to_host(groups[0].spare[:len(scalars)]).astype(np.float64)


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
