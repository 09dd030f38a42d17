"""Exercise: the embedding's backward, a scatter-add (Section 3.4)."""
from __future__ import annotations

import numpy as np

from numformer.finite_differences import GradCase
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


def _entry_sets(args, shape):
    """The entries of the embedding's words: the padding id's and the repeated ids' rows, of the table (V, d) or
    of the positions (n, d)."""
    ids = np.asarray(args["ids"]).ravel()
    values, counts = np.unique(ids, return_counts=True)
    if len(shape) != 2:
        return {}
    if shape[0] == ids.size:  # one row per position
        return {"padding": (ids == PAD)[:, None], "repeated ids": np.isin(ids, values[counts > 1])[:, None]}
    rows = np.zeros((shape[0], 1), dtype=bool)
    pad, repeated = rows.copy(), rows.copy()
    if PAD < shape[0] and (ids == PAD).any():
        pad[PAD] = True
    repeated[values[counts > 1]] = True
    return {"padding": pad, "repeated ids": repeated}


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
    stage="table",
    name="embedding", title="the embedding's backward", paper="Section 3.4", target=embedding_backward,
    symbols={"n": lambda a: a["ids"].size, "d": lambda a: a["dy"].shape[-1]},
    entry_sets=_entry_sets,
    layer=Embedding, cases=cases, outputs=("grad",), swap="Embedding", upstream=("dy",), in_place=("grad",),
    mistakes=(repeated_ids_overwritten, scale_forgotten, assigned_not_added, new_array_not_in_place),
    notes="grad is the weight's .grad (V, d_model): add into it in place and return it. ids (n,) and dy (n, d_model) "
          "are flattened over batch and time; scale is sqrt(d_model), or 1 when the layer has no scale. Forward "
          "is W[ids] * scale; padding ids are ordinary rows here.",
    forward="""
        The token embedding (Section 3.4): a lookup of rows of the learned matrix W (V, d_model), multiplied by
        sqrt(d_model). The layer flattens batch and time into n positions; position t holds the token id ids_t
        and gets

            e_t  = scale * W[ids_t]            e_t is (d_model,): row ids_t of W, scaled
            e_tj = scale * W_(ids_t, j)        t = 1 .. n, j = 1 .. d_model

        with scale = sqrt(d_model), or 1 for a layer built with scale=False. The same id can occur at many
        positions (within a sentence and across the batch); padding ids are ordinary rows here. Section 3.4
        shares one matrix between the two embedding layers and the pre-softmax linear transformation (weight
        tying), so W is used by several layers and its gradient collects a contribution from each.

        Your function receives grad, the weight's .grad array (V, d_model), which may already hold the gradient
        of W's other uses; ids (n,), int; dy = dL/de (n, d_model); and scale (float). It must add this layer's
        contribution to dL/dW into grad, in place (the layer ignores your return value: it relies on grad having
        changed), and return grad. The ids have no gradient.""",
    returns="Add this layer's contribution to dL/dW (V, d_model) into grad in place and return grad, from the ids "
            "(n,), dy = dL/de (n, d_model) and the forward's scale.",
    steps=("Entry W_vj reaches the output exactly at the positions t that looked up row v (ids_t = v), as e_tj = "
           "scale * W_vj, so de_tj/dW_vj = scale there and 0 elsewhere. The chain rule sums over those positions: "
           "dL/dW_vj = sum over the t with ids_t = v of scale * dy_tj. A row of W that no position looked up gets "
           "nothing from this layer.",
           "Repeated ids: a row used at several positions gets the sum of all their contributions, not the last "
           "one (a shared variable's gradient is the sum over its uses). Padding ids are no exception here: their "
           "rows get gradient like any other.",
           "The scale: forward multiplied each looked-up row by scale, so every contribution is scale * dy_t, not "
           "dy_t alone (scale = sqrt(d_model), or 1 without scaling).",
           "Tied weights: grad may already hold the gradient of W's other uses (the other embedding, the pre-softmax "
           "projection), and W's gradient is the sum over all of its uses: add into grad, never assign; and add "
           "into the very array you were given, since the layer reads weight.grad, not your return value.",
           "Whole backward: grad[ids_t] += scale * dy_t for every position t, repeated ids summed. In NumPy the "
           "obvious grad[ids] += scale * dy is wrong with repeated ids: fancy-index += is buffered and writes each "
           "repeated row once (one contribution survives). Use np.add.at(grad, ids, scale * dy), an unbuffered "
           "scatter-add that accumulates repeats in place (numformer.backend.scatter_add does the same on NumPy "
           "and CuPy arrays), then return grad."))
