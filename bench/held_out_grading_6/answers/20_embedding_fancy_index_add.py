"""Exercise 10 of 18: the embedding's backward (Section 3.4). Level: derive.

The token embedding (Section 3.4): a lookup of rows of the learned matrix W (V, d_model), multiplied
by sqrt(d_model). The layer flattens batch and time into n positions; position t holds the token id
ids_t and gets

    e_t  = scale * W[ids_t]            e_t is (d_model,): row ids_t of W, scaled
    e_tj = scale * W_(ids_t, j)        t = 1 .. n, j = 1 .. d_model

with scale = sqrt(d_model), or 1 for a layer built with scale=False. The same id can occur at many
positions (within a sentence and across the batch); padding ids are ordinary rows here. Section 3.4
shares one matrix between the two embedding layers and the pre-softmax linear transformation (weight
tying), so W is used by several layers and its gradient collects a contribution from each.

Your function receives grad, the weight's .grad array (V, d_model), which may already hold the
gradient of W's other uses; ids (n,), int; dy = dL/de (n, d_model); and scale (float). It must add
this layer's contribution to dL/dW into grad, in place (the layer ignores your return value: it
relies on grad having changed), and return grad. The ids have no gradient.

Your part: derive the backward pass on paper from the forward above, then write the body of
embedding_backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (5 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_embedding.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_embedding.py

When it checks exact, train with it (every Embedding numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap Embedding=bench/held_out_grading_6/answers/my_embedding.py:Embedding
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap Embedding=bench/held_out_grading_6/answers/my_embedding.py:Embedding
"""

import numpy as np

from numformer.layers.embedding import Embedding as NumformerEmbedding
from numformer.swap import using

EXERCISE = "embedding"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.layers.embedding.Embedding.forward:
# def forward(self, ids):
#     """ids (...,) int -> (..., d_model)."""
#     ids = get_array_module(self.weight.data).asarray(ids)  # host ids for a device weight are moved
#     out = self.weight.data[ids] * self.scale
#     self.save_for_backward(ids=ids)
#     return out
#
# numformer.layers.embedding.Embedding.backward:
# def backward(self, dy):
#     ids, dy = self.pop_saved("ids").reshape(-1), dy.reshape(-1, self.d_model)
#     if self.padding_idx is not None:
#         dy = without_padding_rows(ids, dy, self.padding_idx)
#     kernel(embedding_backward)(self.weight.grad, ids, dy, self.scale)
#     return None
#
# kernel(f) is numformer's switch to a fast version of f; for your function it is your function.


def embedding_backward(grad, ids, dy, scale: float):
    """Add this layer's contribution to dL/dW (V, d_model) into grad in place and return grad, from
    the ids (n,), dy = dL/de (n, d_model) and the forward's scale."""
    contrib = dy * scale
    grad[ids] += contrib
    return grad


# numformer's Embedding, its methods calling your embedding_backward (leave this line as it is):
# `python -m grad_checks check` grades the function above, `train.py --swap` trains with this class.
Embedding = using(NumformerEmbedding, embedding_backward=embedding_backward)
