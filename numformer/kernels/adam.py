"""Fast Adam on the host: every tensor cut into cache-sized blocks, the blocks spread over the threads.

Same inputs and effect as :func:`numformer.optim.adam_update` (in place on the parameters
and moments, bit for bit the same arithmetic): each block runs the dozen ufunc passes
of the update with one scratch buffer while it is in cache, then zeroes its gradient
if asked (instead of a second pass over every gradient afterwards).
Block size measured (base, 52M parameters, 2 threads): 1<<15 136 ms, 1<<16 106 ms,
1<<17 88 ms, 1<<18 87 ms, 1<<19 96 ms, 1<<22 104 ms.
"""
from __future__ import annotations

import numpy as np

from ..backend import is_cupy_array
from .twins import replaces
from .host.threads import parallel_tasks

ADAM_BLOCK = 1 << 17  # elements per block


@replaces("numformer.optim.adam_update", when=lambda params, *a, **k: not (params and is_cupy_array(params[0])))
def adam_update_fast(params, grads, ms, vs, step_size: float, b1: float, b2: float, bc2_sqrt: float, eps: float,
                     zero_grad: bool = False) -> None:

    def update(pc, gc, mc, vc):
        tmp = np.multiply(gc, 1.0 - b1)
        mc *= b1
        mc += tmp
        np.multiply(gc, gc, out=tmp)
        tmp *= 1.0 - b2
        vc *= b2
        vc += tmp
        np.sqrt(vc, out=tmp)
        tmp /= bc2_sqrt
        tmp += eps
        np.divide(mc, tmp, out=tmp)
        tmp *= step_size
        pc -= tmp
        if zero_grad:
            gc.fill(0)

    tasks, sizes = [], []
    for arrays in zip(params, grads, ms, vs):
        n = arrays[0].size
        if all(a.flags.c_contiguous for a in arrays) and n > ADAM_BLOCK:
            flat = [a.reshape(-1) for a in arrays]  # views: contiguous
            for i in range(0, n, ADAM_BLOCK):
                tasks.append(tuple(f[i:i + ADAM_BLOCK] for f in flat))
                sizes.append(min(ADAM_BLOCK, n - i))
        else:
            tasks.append(arrays)
            sizes.append(n)
    parallel_tasks(update, tasks, sizes)
    return None
