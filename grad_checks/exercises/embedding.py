"""Exercise: the embedding's backward, a scatter-add (Section 3.4)."""
from __future__ import annotations

import numpy as np

from numformer.gradcheck import GradCase
from numformer.layers.embedding import Embedding, embedding_backward

from ..cases import D, PAD, V, Holder
from ..exercise import Exercise


def repeated_ids_overwritten(grad, ids, dy, scale):
    """grad[ids] += ... keeps one row per repeated id (NumPy's fancy-index += does not accumulate): use np.add.at."""
    grad[ids] += dy * scale
    return grad


def scale_forgotten(grad, ids, dy, scale):
    """The sqrt(d_model) scale is missing: forward multiplies each row by scale, so its gradient is scaled too."""
    np.add.at(grad, ids, dy)
    return grad


def assigned_not_added(grad, ids, dy, scale):
    """grad is overwritten: with tied weights other uses (the other embedding, the output projection) add into it too."""
    grad[...] = 0.0
    np.add.at(grad, ids, dy * scale)
    return grad


def new_array_not_in_place(grad, ids, dy, scale):
    """The sum goes to a new array: the layer adds into weight.grad through the grad it hands you, in place."""
    out = np.zeros_like(grad)
    np.add.at(out, ids, dy * scale)
    return out + grad


def _ids(rng, shape, lengths):
    ids = rng.integers(1, V, size=shape)
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
    return ids


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    ids = _ids(rng, (3, 6), [6, 4, 2])
    ids[0, :3] = 5  # one id three times in a sentence, and again in another
    ids[1, 1] = 5
    one = cls(V, D, rng=rng, dtype=np.float64)
    src = cls(V, D, rng=rng, dtype=np.float64)
    tied = Holder(src=src, tgt=cls(V, D, weight=src.weight, rng=rng, dtype=np.float64))
    src_ids, tgt_ids = _ids(rng, (2, 5), [5, 3]), _ids(rng, (2, 4), [4, 4])
    tgt_ids[1, 0] = src_ids[0, 0]  # an id used by both sides
    plain = cls(V, D, scale=False, rng=rng, dtype=np.float64)
    return [GradCase("Embedding", "repeated ids + padding", one, {},
                     lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1]),
            GradCase("Embedding", "tied: source and target share one matrix", tied, {},
                     lambda m, i: (m.src(src_ids), m.tgt(tgt_ids)),
                     lambda m, g: (m.tgt.backward(g[1]), m.src.backward(g[0]), {})[2]),
            GradCase("Embedding", "without the scale (scale=False)", plain, {},
                     lambda m, i: m(ids), lambda m, g: (m.backward(g[0]), {})[1])]


EXERCISE = Exercise(
    name="embedding", title="the embedding's backward", paper="Section 3.4", target=embedding_backward,
    layer=Embedding, cases=cases, outputs=("grad",), swap="Embedding", in_place=("grad",),
    mistakes=(repeated_ids_overwritten, scale_forgotten, assigned_not_added, new_array_not_in_place),
    notes="grad is the weight's .grad (V, d_model): add into it in place and return it. ids (n,) and dy (n, d_model) "
          "are flattened over batch and time; scale is sqrt(d_model), or 1 when the layer has no scale. Forward "
          "is W[ids] * scale; padding ids are ordinary rows here.")
