"""Students' wrong backward passes of the layers with more moving parts: scaled dot-product attention, the two
embedding tables, the linear map and multi-head attention, each with the first wrong step it must be told.

The second half of tests/exercises/student_mistakes.py (which says what the expectations mean): the solutions
here register into the same :data:`student_mistakes.SOLUTIONS`. The attention solutions write the softmax's
backward out themselves (only numpy and the arguments), so numformer's ``softmax_backward(dp, p)`` is matched by
the value of their own expression.
"""
import numpy as np

from student_mistakes import expect

# ---- attention: dv = P_used^T dO; dp = dropout'(dO V^T); ds = softmax'(dp, p); ds[masked] = 0; ds *= scale ---
# numformer binds ds three times (and dp twice): the steps are named by their source text there.
WHERE = "xp.where(masked, xp.asarray(0, dtype=ds.dtype), ds)"
SOFTMAX = "softmax_backward(dp, p)"


def attention_mask_polarity_reversed(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    d_weights = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        d_weights = dropout_backward(d_weights)
    row_dot = (d_weights * p).sum(axis=-1, keepdims=True)
    d_scores = p * (d_weights - row_dot)
    if masked is not None:
        # "keep the gradient where the mask is": masked is True at the replaced scores, so this keeps exactly those
        d_scores = np.where(masked, d_scores, 0.0)
    d_scores = d_scores * scale
    dq = d_scores @ k
    dk = d_scores.swapaxes(-1, -2) @ q
    dv = p_used.swapaxes(-1, -2) @ dout
    return dq, dk, dv


def attention_scale_forgotten_in_dk(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    dv = p_used.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds_scaled = ds * scale
    dq = ds_scaled @ k
    dk = ds.swapaxes(-1, -2) @ q
    return dq, dk, dv


def attention_values_weighted_by_p(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # p where p_used multiplied V: the same array without attention dropout, another one with it
    dv = np.swapaxes(p, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds *= scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


def attention_row_sum_over_queries(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    dv = p_used.swapaxes(-1, -2) @ dout
    grad_p = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        grad_p = dropout_backward(grad_p)
    # axis -2 runs over the queries: each softmax row is one query's weights over the keys (the last axis)
    total = (grad_p * p).sum(axis=-2, keepdims=True)
    grad_s = p * (grad_p - total)
    if masked is not None:
        grad_s = np.where(masked, 0.0, grad_s)
    grad_s = grad_s * scale
    return grad_s @ k, grad_s.swapaxes(-1, -2) @ q, dv


def attention_dropout_after_the_softmax(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # the forward drops weights after the softmax, so its backward must come before the softmax's, on dP
    dv = p_used.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if dropout_backward is not None:
        ds = dropout_backward(ds)
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds = ds * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def attention_scaled_twice(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    d_out_p = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        d_out_p = dropout_backward(d_out_p)
    d_scores = p * (d_out_p - (d_out_p * p).sum(axis=-1, keepdims=True))
    if masked is not None:
        d_scores = np.where(masked, 0.0, d_scores)
    d_scores = d_scores * scale
    # the scale again for the product Q K^T: d_scores is already the gradient of Q K^T
    dq = (scale * d_scores) @ k
    dk = (scale * d_scores).swapaxes(-1, -2) @ q
    dv = p_used.swapaxes(-1, -2) @ dout
    return dq, dk, dv


def attention_softmax_backward_with_p_used(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    dv = p_used.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    # the softmax's backward needs its own output, p: p_used is dropout's output
    inner = (dp * p_used).sum(axis=-1, keepdims=True)
    ds = p_used * (dp - inner)
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds = ds * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


expect(attention_mask_polarity_reversed, "attention", step=WHERE, line="np.where(masked, d_scores, 0.0)",
       pattern="mask reversed", note="masked is True where a score was replaced: those get 0, the others keep dS")
expect(attention_scale_forgotten_in_dk, "attention", step="ds.swapaxes(-1, -2)",
       line="dk = ds.swapaxes(-1, -2) @ q", factor="sqrt(d_k)",
       note="dK = dS^T Q * scale: the scaled dS was made for dQ and forgotten for dK (scale = 1/sqrt(d_k): d_k 4 "
            "and 8 in the cases, so the factor is named by its symbol); the term "
            "named is the transpose, of the unscaled ds (issue 67: the smallest one whose value is known)")
expect(attention_values_weighted_by_p, "attention", step="p_used.swapaxes(-1, -2)",
       line="dv = np.swapaxes(p, -1, -2) @ dout",
       note="dV = P_used^T dO: with attention dropout the weights that multiplied V are p_used, not p (the term named "
            "is the transposed weights)")
expect(attention_row_sum_over_queries, "attention", step="(dy * y).sum(axis=-1, keepdims=True)",
       line="(grad_p * p).sum(axis=-2, keepdims=True)",
       note="the softmax's row sum runs over the keys (the last axis), each query's row on its own; the line is the "
            "sum's (issue 67: with numformer's row sum there, every gradient is right; the line using it is right)")
expect(attention_dropout_after_the_softmax, "attention", step="dropout_backward(dp)", line="ds = dropout_backward(ds)",
       note="dropout came after the softmax in the forward, so its backward comes before the softmax's, on dP")
expect(attention_scaled_twice, "attention", step="ds * scale", line="dq = scale * d_scores @ k",
       second="ds * scale", factor="1/sqrt(d_k)", note="the scale enters once: dS * scale is already dL/d(Q K^T); the term "
       "named is the smallest known wrong, scale * d_scores, in each of the two lines (issue 67)")
expect(attention_softmax_backward_with_p_used, "attention", step=SOFTMAX, line="ds = p_used * (dp - inner)",
       note="the softmax's backward takes the softmax's output p; p_used is what dropout made of it")


# ---- the token embedding: grad[ids] += dy * scale, repeated ids summed (a scatter-add) ----------------------
SCATTER = "scatter_add(grad, ids, dy * scale)"


def embedding_repeated_ids_lost_and_scale_inverted(grad, ids, dy, scale):
    # "undo the forward's scaling": divided, where the chain rule multiplies
    g = dy / scale
    grad[ids] += g
    return grad


def embedding_padding_rows_zeroed(grad, ids, dy, scale):
    # PyTorch's padding_idx habit (pad is 0): numformer's embedding gives the padding row its gradient
    contrib = dy * scale
    contrib[ids == 0] = 0.0
    np.add.at(grad, ids, contrib)
    return grad


def embedding_repeated_ids_averaged(grad, ids, dy, scale):
    # an id used k times gets the mean of its k contributions: a shared row's gradient is their sum
    contrib = dy * scale
    counts = np.bincount(ids, minlength=grad.shape[0])
    np.add.at(grad, ids, contrib / counts[ids][:, None])
    return grad


def embedding_reduceat_first_group_lost(grad, ids, dy, scale):
    # sort + reduceat (no np.add.at): the group starts are where the id changes, and the first group's 0 is missing
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    rows = (dy * scale)[order]
    starts = np.flatnonzero(np.diff(sorted_ids)) + 1
    sums = np.add.reduceat(rows, starts, axis=0)
    grad[sorted_ids[starts]] += sums
    return grad


def embedding_first_occurrence_only(grad, ids, dy, scale):
    # one update per distinct id, so that no row is written twice: the other occurrences are dropped
    contrib = dy * scale
    seen, first = np.unique(ids, return_index=True)
    grad[seen] += contrib[first]
    return grad


expect(embedding_repeated_ids_lost_and_scale_inverted, "embedding", step="dy * scale", line="g = dy / scale",
       second=SCATTER, note="two mistakes: the scale multiplies (forward multiplied), and grad[ids] += keeps one "
       "contribution per repeated id (np.add.at sums them)")
expect(embedding_padding_rows_zeroed, "embedding", step=SCATTER, line="np.add.at(grad, ids, contrib)",
       pattern="padding", note="padding ids are ordinary rows here: their gradient is not zeroed")
expect(embedding_repeated_ids_averaged, "embedding", step=SCATTER, line="np.add.at(grad, ids, contrib / counts",
       pattern="repeated ids", note="a row used k times gets the sum of its k contributions, not their mean")
expect(embedding_reduceat_first_group_lost, "embedding", step=SCATTER, line="grad[sorted_ids[starts]] += sums",
       note="the first group starts at 0: np.diff finds only the later starts, so the smallest id gets nothing")
expect(embedding_first_occurrence_only, "embedding", step=SCATTER, line="grad[seen] += contrib[first]",
       pattern="repeated ids", note="every occurrence of an id adds to its row, not only the first")


# ---- learned positions: grad[offset:offset + T] += dy summed over the batch --------------------------------
POSITIONS = "dy.reshape(-1, t, d).sum(axis=0)"


def positions_first_sentence_only(grad, dy, offset):
    t, d = dy.shape[-2:]
    per_position = dy.reshape(-1, t, d)[0]
    grad[offset:offset + t] += per_position
    return grad, dy


def positions_reshaped_time_first(grad, dy, offset):
    # (T, -1, d) where (-1, T, d) keeps each position's rows together
    t, d = dy.shape[-2:]
    by_position = dy.reshape(t, -1, d).sum(axis=1)
    grad[offset:offset + t] += by_position
    return grad, dy


expect(positions_first_sentence_only, "learned_positions", step=POSITIONS, line="dy.reshape(-1, t, d)[0]",
       note="every sentence of the batch added the same rows: sum over the batch, not its first sentence")
expect(positions_reshaped_time_first, "learned_positions", step=POSITIONS, line="dy.reshape(t, -1, d).sum(axis=1)",
       note="reshape(T, -1, d) regroups the batch's rows across positions: reshape(-1, T, d) and sum axis 0")


# ---- linear: dx = dy W^T, dW = x^T dy, db = sum of dy over the rows ----------------------------------------

def linear_ones_column_read_from_the_wrong_end(dy, x, w, with_bias):
    # the bias as the weight of a column of ones appended to x: its gradient is the last row, not the first
    dx = dy @ w.T
    if not with_bias:
        return dx, x.T @ dy, None
    xa = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    dwa = xa.T @ dy
    return dx, dwa[1:], dwa[0]


def linear_weight_gradient_reshaped_not_transposed(dy, x, w, with_bias):
    dx = dy @ w.T
    dw = dy.T @ x
    # (d_out, d_in) is PyTorch's layout: made to fit numformer's (d_in, d_out) by a reshape, not a transpose
    dw = dw.reshape(w.shape)
    db = dy.sum(axis=0) if with_bias else None
    return dx, dw, db


expect(linear_ones_column_read_from_the_wrong_end, "linear", step="matmul(x.T, dy)", line="dwa[1:], dwa[0]",
       second="dy.sum(axis=0)", note="the ones column was appended last: db is dwa[-1] and dW is dwa[:-1] (dwa is "
       "x^T dy and the bias' row side by side, known; dW is read first)")
expect(linear_weight_gradient_reshaped_not_transposed, "linear", step="matmul(x.T, dy)", line="dw.reshape(w.shape)",
       note="dy^T x is the transpose of dW = x^T dy: a reshape to W's shape scrambles it")


# ---- multi-head attention (a method): each path through its own projection's backward, the paths summed -----

def multihead_key_path_added_twice(self, dy):
    d_concat = self.w_o.backward(dy)
    dq, dk, dv = self.attention.backward(self._split(d_concat))
    from_q = self.w_q.backward(self._merge(dq))
    from_k = self.w_k.backward(self._merge(dk))
    from_v = self.w_v.backward(self._merge(dv))
    # copy-paste: from_k where from_v belongs (from_v is computed, so W^V's gradients are right)
    dkv = from_k + from_k
    if self._cross:
        return from_q, dkv
    return from_q + dkv


expect(multihead_key_path_added_twice, "multihead", step="dkv", line="dkv = from_k + from_k",
       note="the keys and the values both came from kv: dkv = (K path) + (V path), each path once")
