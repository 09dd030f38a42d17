"""Per-sentence gradients of every parameterised layer, as math: what each sentence of a batch adds.

Every parameter gradient of the Transformer is a sum over the batch's sentences before it is a sum
over anything else, because every layer acts on each sentence alone (attention's masks keep the
sentences apart) and the loss is a sum over tokens divided by the batch's token count N
(Section 5.4; ``numformer/loss.py``). Writing the upstream gradient of sentence b as ``dy_b``
(already divided by N), the layers' backward passes (their own pages in this package) split as:

* Linear (``y = x W + b``, Section 3.3): ``dW = sum_b x_b^T dy_b``, ``db = sum_b sum_t dy_b,t``;
* LayerNorm (``y = gamma * xhat + beta``, Section 3.1): ``dgamma = sum_b sum_t dy_b,t * xhat_b,t``,
  ``dbeta = sum_b sum_t dy_b,t``;
* the pre-softmax projection (``logits = h W^T``, Section 3.4): ``dW = sum_b dlogits_b^T h_b``;
* an embedding (``W[ids] * scale``, Section 3.4) and a learned position table (``P[offset + t]``,
  Table 3 row E): each row of sentence b scatters into the table, ``dW_b[ids_b,t] += scale * dy_b,t``
  (an embedding with ``padding_idx``: the rows of the positions holding it scatter nothing).

The functions below compute the summands, one per sentence, for a chunk of c sentences: the batch
gradient is their sum. When only their squared norms are wanted, a product's summand need not be
formed: ``|x_b^T dy_b|^2 = sum_{t,t'} (x_b x_b^T)_{tt'} (dy_b dy_b^T)_{tt'}``, two (T, T) Gram matrices per
sentence instead of a (d_in, d_out) matrix (the ``*_sq_norms`` functions). Their inputs are what the layers cache for their backward, with the sentence
axis first: ``(c, T, ...)``. Dense ones return ``(c, *parameter shape)``; the two tables return the
rows to scatter, ``(c, K)`` ids and ``(c, K, d_model)`` rows, because a sentence touches K of the
table's rows only. numformer/training/per_sentence_gradients.py reduces them (squared norms, sums of squares)
a chunk at a time, and adds up a tied matrix's uses per sentence first.
"""
from __future__ import annotations

from ..backend import get_array_module


def linear_per_sentence(x, dy):
    """Linear: ``dW_b = x_b^T dy_b`` (c, d_in, d_out) and ``db_b = sum_t dy_b,t`` (c, d_out),
    from x (c, T, d_in) and dy (c, T, d_out)."""
    return x.swapaxes(-1, -2) @ dy, dy.sum(axis=1)


def product_sq_norms(a, b):
    """``|a_b^T b_b|^2`` for every sentence b without forming ``a_b^T b_b``: the sum over t, t' of the
    elementwise product of the Gram matrices ``a_b a_b^T`` and ``b_b b_b^T``; a (c, T, m), b (c, T, n) -> (c,)."""
    return ((a @ a.swapaxes(-1, -2)) * (b @ b.swapaxes(-1, -2))).sum(axis=(1, 2))


def linear_sq_norms(x, dy):
    """Linear: ``|dW_b|^2 = |x_b^T dy_b|^2`` and ``|db_b|^2``, each (c,), from x (c, T, d_in) and dy (c, T, d_out)."""
    db = dy.sum(axis=1)
    return product_sq_norms(x, dy), (db * db).sum(axis=-1)


def projection_on_rows(h, dlogits, ids):
    """The projection's summand on the rows ``ids`` (c, K) only: ``dW_b[ids_b,k] = dlogits_b[:, ids_b,k]^T h_b``,
    (c, K, d_model), without forming the (vocab, d_model) matrix."""
    xp = get_array_module(h)
    columns = xp.take_along_axis(dlogits, xp.broadcast_to(ids[:, None, :], (*dlogits.shape[:2], ids.shape[1])), axis=2)
    return columns.swapaxes(-1, -2) @ h


def layernorm_per_sentence(xhat, dy):
    """LayerNorm: ``dgamma_b = sum_t dy_b,t * xhat_b,t`` and ``dbeta_b = sum_t dy_b,t``, each (c, d),
    from xhat and dy (c, T, d)."""
    return (dy * xhat).sum(axis=1), dy.sum(axis=1)


def projection_per_sentence(h, dlogits):
    """Pre-softmax projection: ``dW_b = dlogits_b^T h_b`` (c, vocab, d_model), from h (c, T, d_model) and
    dlogits (c, T, vocab)."""
    return dlogits.swapaxes(-1, -2) @ h


def embedding_per_sentence(ids, dy, scale: float, padding_idx: int | None = None):
    """Embedding: the rows sentence b scatters into W, ``dW_b[ids_b,t] += scale * dy_b,t``: ids (c, T) and
    rows (c, T, d_model), from ids (c, T) and dy (c, T, d_model). A repeated id sums its rows; the positions
    holding ``padding_idx`` (when given) scatter zero rows (the pad row's gradient rule, layers/embedding.py)."""
    if padding_idx is not None:
        dy = get_array_module(dy).where((ids == padding_idx)[..., None], 0, dy)
    return ids, dy * scale


def positions_per_sentence(offset: int, dy):
    """Learned positions: ``dP_b[offset + t] += dy_b,t``: the table's rows offset..offset+T-1 for every
    sentence, ids (c, T) and rows (c, T, d_model), from dy (c, T, d_model)."""
    xp = get_array_module(dy)
    c, t = dy.shape[:2]
    return xp.broadcast_to(xp.arange(offset, offset + t)[None, :], (c, t)), dy
