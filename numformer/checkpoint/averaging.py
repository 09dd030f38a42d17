"""Checkpoint averaging (Section 6.1): "For the base models, we used a single model obtained by averaging
the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged the
last 20 checkpoints."

At the end of training a run's last ``--average-last`` checkpoints are averaged into ``RUN/averaged.npz``
(:meth:`numformer.training.run_folder.RunFolder.average`); ``python -m numformer.checkpoint average``
averages any checkpoints given.
"""
from __future__ import annotations

import numpy as np

from . import Checkpoint, CheckpointError, load_checkpoint
from .one_run import refuse_other_run


def average_checkpoints(paths) -> Checkpoint:
    """The element-wise mean of the weights of several checkpoints. Meta (with ``averaged_from``, the
    sources) and vocabulary come from the last one; no optimizer state. Summed in float64, so the mean
    of many float32 checkpoints loses nothing to rounding, and returned in each tensor's dtype. Checkpoints
    of different vocabularies or model configurations are refused in one line naming the first difference
    (:mod:`.one_run`): equal shapes do not make one model."""
    paths = list(paths)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total, meta, dtypes, vocab, first = None, {}, {}, None, None
    for p in paths:
        ck = load_checkpoint(p, with_optimizer=False)
        if total is None:
            total = {k: v.astype(np.float64) for k, v in ck.model.items()}
            dtypes = {k: v.dtype for k, v in ck.model.items()}
            first = ck
        else:
            refuse_other_run(paths[0], first, p, ck)  # equal shapes do not make one model
            if set(ck.model) != set(total) or any(ck.model[k].shape != total[k].shape for k in total):
                raise CheckpointError(f"{p} does not have the same tensors as {paths[0]}: cannot average them")
            for k in total:
                total[k] += ck.model[k]
        meta, vocab = ck.meta, ck.vocab
    averaged = {k: (v / len(paths)).astype(dtypes[k]) for k, v in total.items()}
    meta = dict(meta, averaged_from=[str(p) for p in paths])
    return Checkpoint(model=averaged, meta=meta, vocab=vocab)
