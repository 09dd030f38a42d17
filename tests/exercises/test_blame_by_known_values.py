"""Issue 67: a grader a student can trust. A line is named wrong only where the value it must hold is known (numformer's
value, the adjoint of a forward quantity, a size the exercise names, a multiple of one the student's route needs), the
smallest wrong expression of it is named with what it should be, and two lines that could each absorb the error are
named together, never one alone (grad_checks/first_wrong_step.py).

One test per kind of failure the issue reports, each with a wrong answer written here (numpy only, the reference's
signature) and what the diagnosis must and must never say; each of these failed at 4439216:

* right lines blamed: LayerNorm derived through std with ``dstd / 2 * std`` (read as ``(dstd / 2) * std``) where
  ``dstd / (2 * std)`` belongs: the line of dstd (right) was blamed, an edit there compensating; two casts to float32
  were told a missing minus sign, "differs at 0 of 144 entries"; a tied embedding that wipes the rows it scatters into
  had the scatter blamed; a decoder layer passing ``dy`` where the feed-forward's gradient belongs got "it uses `dy`
  where numformer's uses dy"; dropout's and multi-head attention's factor was named at a line after the wrong one;
* vague where proof was missing: a two-line SiLU backward and a two-line softmax backward got "the mistake is on lines
  ... or ..." for one wrong term;
* a LayerNorm's dxhat doubled named together with the line after it, right ("no value known here"), and a fix
  suggested at a term beside the one named (``x * 2.0`` where ``dy * 0.5`` halves dW);
* LayerNorm by the variance route with ``r ** 2`` for ``r ** 3``: the line after it blamed, a compensating edit
  suggested;
* a gain bound where its gradient belongs (``dxhat = gamma``), dL/dmu summed over the rows, the tanh identity's
  2 written 4, a factor extra at the end of a product, a constant of the student's own wrong (``np.sqrt(2)``):
  each blamed on a line using the wrong value, or on the first factor of the product;
* a step of numformer's left out (the attention dropout's backward, the loss' weight) blamed on the line after it,
  which is right, or said as "passes `dz` where numformer's passes the returned dz";
* mistakes not seen: a table gradient summed over time as well, not matched to numformer's (T, d) value; a GELU-tanh
  answer with two mistakes got "the term `1` enters 2.33333 times" (and one with ``(1 - t) ** 2`` for ``1 - t ** 2``
  was not located).

Two guard the rules from going too far, and passed at 4439216 as well: a value of numformer's that the student's code
computes and does not read is no step missing (the line reading the other is named); a softmax built on its own
Jacobian, the Jacobian wrong, never has the product with it named alone.

(State kept from the first call: tests/exercises/test_kept_state.py; the cheats: tests/exercises/test_own_code.py.)
"""
import re

import numpy as np
import pytest

import lab_files
from grad_checks import exercises, lab


# ---- the answers ---------------------------------------------------------------------------------------------------

def layernorm_through_std_precedence(dy, xhat, r, gamma):
    # x - mu = xhat * std; d std / d var = 1 / (2 std), written dstd / 2 * std
    d = dy.shape[-1]
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dxhat = dy * gamma
    std = 1.0 / r
    xmu = xhat * std
    dstd = -(dxhat * xmu).sum(axis=-1, keepdims=True) / std ** 2
    dvar = dstd / 2 * std
    dxmu = dxhat / std + dvar * 2.0 * xmu / d
    dmu = -dxmu.sum(axis=-1, keepdims=True)
    dx = dxmu + dmu / d
    return dx, dgamma, dbeta


def layernorm_two_casts_to_float32(dy, xhat, r, gamma):
    dxhat = (dy * gamma).astype(np.float32)
    centre = dxhat.mean(axis=-1, keepdims=True)
    spread = (dxhat * xhat).astype(np.float32).mean(axis=-1, keepdims=True)
    dx = r * (dxhat - centre - xhat * spread)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def embedding_rows_wiped_before_the_scatter(grad, ids, dy, scale):
    # "start the rows I write from zero": with a tied table the other use's gradient is in those rows
    grad[ids] = 0.0
    np.add.at(grad, ids, dy * scale)
    return grad


def decoder_cross_attention_given_dy(self, dy):
    d_ffn = self.ffn_residual.backward(dy, self.ffn)
    d_cross, dmemory = self.cross_attn_residual.backward(dy, self.cross_attn)
    d_self = self.self_attn_residual.backward(d_cross, self.self_attn)
    return d_self, dmemory


def dropout_scale_doubled(dy, mask):
    inverse = mask.max()  # 1 / (1 - p)
    scale = 2.0 * inverse
    return dy * (mask != 0) * scale


def multihead_query_path_doubled(self, dy):
    d_heads = self._split(self.w_o.backward(dy))
    dq, dk, dv = self.attention.backward(d_heads)
    dq = dq * 2.0
    dx = self.w_q.backward(self._merge(dq))
    dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))
    if self._cross:
        return dx, dkv
    return dx + dkv


def layernorm_features_read_off_the_rows(dy, xhat, r, gamma):
    # d, the features, read off the rows axis
    d = xhat.shape[0]
    g = dy * gamma
    dx = r / d * (d * g - g.sum(axis=-1, keepdims=True) - xhat * (g * xhat).sum(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def multihead_value_gradient_assigned_over_the_keys(self, dy):
    heads = self._split(self.w_o.backward(dy))
    dq, dk, dv = self.attention.backward(heads)
    dx = self.w_q.backward(self._merge(dq))
    dmem = self.w_k.backward(self._merge(dk))
    dmem = self.w_v.backward(self._merge(dv))
    if self._cross:
        return dx, dmem
    return dx + dmem


def residual_branch_assigned_over_the_skip(self, dy, sublayer):
    if self.pre_norm:
        got = sublayer.backward(self.dropout.backward(dy))
        d_sub = got[0] if isinstance(got, tuple) else got
        dx = dy
        dx = self.norm.backward(d_sub)
    else:
        dz = self.norm.backward(dy)
        got = sublayer.backward(self.dropout.backward(dz))
        d_sub = got[0] if isinstance(got, tuple) else got
        dx = dz + d_sub
    return (dx,) + tuple(got[1:]) if isinstance(got, tuple) else dx


def embedding_table_written_whole(grad, ids, dy, scale):
    # the rows gathered in a buffer of their own, then written into the table
    rows = np.zeros_like(grad)
    np.add.at(rows, ids, dy * scale)
    grad[...] = rows
    return grad


def loss_smoothing_added_and_divided_by_the_weights(p, y, eps, weight):
    # two mistakes, each hiding the other from a single fix: + eps / V, and the weights' sum divided out again
    n, v = p.shape
    dz = p + eps / v
    dz[np.arange(n), y] -= 1.0 - eps
    dz = dz * weight[:, None]
    return dz / weight.sum()


def silu_derivative_factored_wrong(dy, x, s):
    # s + x s (1 - s) = s (1 + x (1 - s)), written s (1 + x) (1 - s)
    local = s * (1 + x) * (1 - s)
    return dy * local


def softmax_row_sum_on_the_product(dy, y):
    # the row sum put back on dy * y where it goes on y
    weighted = dy * y
    return weighted - weighted * weighted.sum(axis=-1, keepdims=True)


def positions_summed_over_time_too(grad, dy, offset):
    t, d = dy.shape[-2:]
    total = dy.reshape(-1, d).sum(axis=0)
    grad[offset:offset + t] += total
    return grad, dy


def gelu_tanh_square_of_the_difference(dy, x, gate):
    # tanh' = 1 - tanh^2, written (1 - tanh)^2
    t = 2.0 * gate - 1.0
    du = np.sqrt(2.0 / np.pi) * (1.0 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t) ** 2 * du)


def gelu_tanh_two_mistakes(dy, x, gate):
    # d(x^3)/dx's 3 forgotten in du, and a 2 too many on the product rule's second term
    t = 2.0 * gate - 1.0
    du = np.sqrt(2.0 / np.pi) * (1.0 + 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t ** 2) * du * 2)


def attention_dropout_backward_forgotten(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # the attention dropout's backward left out: dp is dO V^T itself
    dv = p_used.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds = ds * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def attention_dropped_gradient_computed_and_not_used(dout, q, k, v, p, p_used, masked, scale,
                                                     dropout_backward=None):
    # the dropout's backward is there, but the softmax's backward reads the gradient from before it once
    dv = p_used.swapaxes(-1, -2) @ dout
    dp_raw = dout @ v.swapaxes(-1, -2)
    dp = dropout_backward(dp_raw) if dropout_backward is not None else dp_raw
    ds = p * (dp_raw - (dp * p).sum(axis=-1, keepdims=True))
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    ds = ds * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv


def layernorm_gradient_of_xhat_doubled(dy, xhat, r, gamma):
    # dxhat doubled; the line after it, right, takes dxhat only up to a constant a row (it removes the row mean)
    dxhat = dy * gamma * 2.0
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def linear_weight_gradient_halved(dy, x, w, with_bias):
    db = dy.sum(axis=0) if with_bias else None
    dw = (x * 1.0).T @ (dy * 0.5)
    return dy @ w.T, dw, db


def layernorm_variance_route_power_of_r(dy, xhat, r, gamma):
    # dL/dvar = sum(dxhat * (x - mu)) * -1/2 * (var + eps)^(-3/2), written with r ** 2 for r ** 3; then
    # 2 * dvar happens to be dL/d std, the adjoint of another quantity
    d = dy.shape[-1]
    dxhat = dy * gamma
    xmu = xhat / r
    dvar = (dxhat * xmu).sum(axis=-1, keepdims=True) * -0.5 * r ** 2
    dmu = -(dxhat * r).sum(axis=-1, keepdims=True) + dvar * -2.0 * xmu.mean(axis=-1, keepdims=True)
    dx = dxhat * r + dvar * 2.0 * xmu / d + dmu / d
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def softmax_jacobian_without_the_identity(dy, y):
    # J = diag(y) - y y^T, written y_i (1 - y_j): the Jacobian (the forward side, no value known) is wrong
    jac = y[..., :, None] * (1.0 - y[..., None, :])
    return (jac @ dy[..., :, None])[..., 0]


def layernorm_gain_for_its_gradient(dy, xhat, r, gamma):
    # dxhat = gamma: dy forgotten; the later lines broadcast the gain over the rows
    dxhat = gamma
    m1 = dxhat.mean(axis=-1, keepdims=True)
    m2 = (dxhat * xhat).mean(axis=-1, keepdims=True)
    dx = r * (dxhat - m1 - xhat * m2)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_std_route_mean_gradient_over_rows(dy, xhat, r, gamma):
    # dL/dmu summed over the rows (axis 0) where it belongs to each row
    d = dy.shape[-1]
    dxhat = dy * gamma
    std = 1.0 / r
    xmu = xhat * std
    dstd = -(dxhat * xmu).sum(axis=-1, keepdims=True) / std ** 2
    dvar = dstd / (2 * std)
    dxmu = dxhat / std + dvar * 2.0 * xmu / d
    dmu = -dxmu.sum(axis=0, keepdims=True)
    dx = dxmu + dmu / d
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def gelu_tanh_identity_doubled(dy, x, gate):
    # tanh(u) = 2 sigmoid(2u) - 1, written with 4
    c = np.sqrt(2 / np.pi)
    t = 4.0 * gate - 1.0
    du = c * (1 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)


def gelu_tanh_product_halved_twice(dy, x, gate):
    # the product rule's second term, 0.5 x (1 - t^2) du, halved once more at its end
    t = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))
    du = np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du * 0.5)


def gelu_tanh_constant_wrong(dy, x, gate):
    # sqrt(2 / pi) written sqrt(2): the constant, on its own line, is what is wrong
    c = np.sqrt(2)
    t = 2.0 * gate - 1.0
    du = c * (1 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)


def loss_weight_forgotten(p, y, eps, weight):
    dz = p - eps / p.shape[1]
    dz[np.arange(p.shape[0]), y] -= 1.0 - eps
    return dz


def layernorm_std_route_quotient_short_a_std(dy, xhat, r, gamma):
    # d/dstd of (x - mu) / std is -(x - mu) / std ** 2: written / std, the std short; the co-factor 2 xc on the line
    # after could take 2 xhat (xc / std) and put every gradient right, yet that line is right
    n, d = dy.shape
    sd = 1.0 / r
    xc = xhat * sd
    up = dy * gamma
    d_sd = -(up * xc).sum(axis=1, keepdims=True) / sd
    d_var = 0.5 * d_sd / sd
    d_xc = up / sd + 2.0 * xc * d_var / d
    dx = d_xc - d_xc.mean(axis=1, keepdims=True)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_bias_gradient_summed_to_a_number(dy, xhat, r, gamma):
    # dbeta summed over the features as well: a number where (d,) belongs (a shape the grading refuses)
    up = dy * gamma
    dx = r * (up - up.mean(axis=-1, keepdims=True) - xhat * (up * xhat).mean(axis=-1, keepdims=True))
    gain = np.einsum("nd,nd->d", dy, xhat)
    shift = dy.sum()
    return dx, gain, shift


def layernorm_gain_over_features_and_projection_summed(dy, xhat, r, gamma):
    # two mistakes: dgamma summed over the features (shape (n,): the layer cannot add it into its gain's), and the
    # projection a sum where the mean belongs
    gain = (xhat * dy).sum(axis=-1)
    up = dy * gamma
    proj = (up * xhat).sum(axis=-1, keepdims=True)
    dx = r * (up - up.mean(axis=-1, keepdims=True) - xhat * proj)
    return dx, gain, dy.sum(axis=0)


def attention_mask_kept_and_keys_unscaled(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # two mistakes hiding each other: the mask keeps the masked scores' gradient (zeroing the others), and dK lacks
    # the scale; neither fixed alone puts dK right
    dv = np.swapaxes(p_used, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    g = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if masked is not None:
        g = np.where(masked, g, 0.0)
    dq = scale * (g @ k)
    dk = np.swapaxes(g, -1, -2) @ q
    return dq, dk, dv


def decoder_returns_swapped(self, dy):
    # (dL/dmemory, dL/dy) where (dL/dy, dL/dmemory) belongs: shapes (B, S, d) and (B, T, d) the other way round
    after_ffn = self.ffn_residual.backward(dy, self.ffn)
    after_cross, to_memory = self.cross_attn_residual.backward(after_ffn, self.cross_attn)
    to_input = self.self_attn_residual.backward(after_cross, self.self_attn)
    return to_memory, to_input


def decoder_returns_swapped_and_skip_added_again(self, dy):
    # two mistakes: the residual's backward already holds the skip (dy added twice), and the pair returned swapped
    after_ffn = dy + self.ffn_residual.backward(dy, self.ffn)
    after_cross, to_memory = self.cross_attn_residual.backward(after_ffn, self.cross_attn)
    to_input = self.self_attn_residual.backward(after_cross, self.self_attn)
    return to_memory, to_input


def encoder_sublayers_handed_to_each_others_residual(self, dy):
    # each residual's backward given the other block: the feed-forward's runs the attention, and the other way round
    through_ffn = self.ffn_residual.backward(dy, self.self_attn)
    return self.self_attn_residual.backward(through_ffn, self.ffn)


def encoder_attention_given_the_ffn(self, dy):
    # one residual given the wrong block: the attention's residual runs the feed-forward's backward again
    through_ffn = self.ffn_residual.backward(dy, self.ffn)
    return self.self_attn_residual.backward(through_ffn, self.ffn)


def layernorm_upstream_for_its_gain_gradient_and_mean_over_rows(dy, xhat, r, gamma):
    # two mistakes: the gradient of xhat bound to dy itself (gamma forgotten), and the projection's mean over the
    # rows; the second reads the first, so neither alone puts dx right
    g_hat = dy
    centred = g_hat - g_hat.mean(axis=-1, keepdims=True)
    along = (g_hat * xhat).mean(axis=0, keepdims=True)
    return r * (centred - xhat * along), (dy * xhat).sum(axis=0), dy.sum(axis=0)


def positions_summed_over_the_first_axis_only(grad, dy, offset):
    # the batch axes summed as if there were one: (3, 4, d) left where (4, d) belongs for dy (2, 3, 4, d)
    grad[offset:offset + dy.shape[-2]] += dy.sum(axis=0)
    return grad, dy


def attention_softmax_backward_as_the_product_alone(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # the softmax's backward stopped at P * dP (its row-sum term left out): a value of numformer's softmax_backward
    # (its dy * y), standing where that function's result belongs
    dv = np.swapaxes(p_used, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    d_scores = p * dp
    if masked is not None:
        d_scores = np.where(masked, 0.0, d_scores)
    d_scores = d_scores * scale
    return d_scores @ k, np.swapaxes(d_scores, -1, -2) @ q, dv


def positions_input_gradient_summed_like_the_table(grad, dy, offset):
    # dx bound to the table's gradient (dy summed over the batch), a right value in the wrong place: dx = dy belongs
    lead = tuple(range(dy.ndim - 2))
    grad[offset:offset + dy.shape[-2]] += dy.sum(axis=lead)
    dx = dy.sum(axis=lead)
    return grad, dx


# ---- grading them --------------------------------------------------------------------------------------------------

def _checked(fn, exercise, tmp_path):
    ex = exercises.get(exercise)
    path = lab_files.write(ex, fn, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result is not None, message
    assert "Traceback" not in str(result) and result.mistake is None, str(result)
    return path, result


def _line(path, snippet) -> int:
    """The line (1-based) of the student's code, from its def on, holding ``snippet``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, text in enumerate(lines) if re.match(r"\s*def \w*backward\(", text))
    found = [i + 1 for i in range(start, len(lines)) if snippet in lines[i]
             and not lines[i].lstrip().startswith("#")]
    assert len(found) == 1, (snippet, found)
    return found[0]


def _first(result):
    steps = [s for s in result.steps if s.proven]
    assert steps, str(result)
    return steps[0]


# (answer, exercise, the snippet of the line named, snippets of right lines never named, words the step must say)
NAMED = [
    (layernorm_through_std_precedence, "layernorm", "dvar = dstd / 2 * std",
     ("dstd = -(dxhat", "xmu = xhat * std", "std = 1.0 / r", "dxmu = ", "dx = dxmu"),
     ("dL/d(var)", "Python reads `dstd / 2 * std` as `(dstd / 2) * std`", "`dstd / (2 * std)`")),
    (embedding_rows_wiped_before_the_scatter, "embedding", "grad[ids] = 0.0", ("np.add.at(grad",), ()),
    (decoder_cross_attention_given_dy, "decoder_layer", "self.cross_attn_residual.backward(dy", ("d_ffn = ", "d_self ="),
     ("passes `dy`", "your `d_ffn`")),
    (dropout_scale_doubled, "dropout", "scale = 2.0 * inverse", ("return dy", "inverse = mask.max()"),
     ("must be 1/keep",)),
    (multihead_query_path_doubled, "multihead", "dq = dq * 2.0", ("dx = self.w_q", "dkv = "), ("2 times",)),
    (silu_derivative_factored_wrong, "silu", "local = ", ("return dy",), ()),
    (softmax_row_sum_on_the_product, "softmax", "return weighted - weighted *", ("weighted = dy * y",),
     ("the returned dx",)),
    (positions_summed_over_time_too, "learned_positions", "total = dy.reshape(-1, d).sum(axis=0)",
     ("grad[offset:offset + t] += total",), ("summed over its axis 0 as well",)),
    (gelu_tanh_square_of_the_difference, "gelu_tanh", "return dy * (0.5", ("t = 2.0", "du = "),
     ("`(1.0 - t) ** 2`", "2 times", "`1.0 - t ** 2`")),
    (gelu_tanh_two_mistakes, "gelu_tanh", "du = np.sqrt", ("t = 2.0",), ("1/2 times",)),
    # a value the later code takes up to a constant a row is pinned by its adjoint (dL/d xhat): the line of dxhat
    (layernorm_gradient_of_xhat_doubled, "layernorm", "dxhat = dy * gamma * 2.0", ("dx = r *",),
     ("2 times", "a fix: `dy * gamma` for `dy * gamma * 2.0`")),
    # the fix suggested is of the term named, never of the term beside it (x * 2.0 would compensate)
    (linear_weight_gradient_halved, "linear", "dw = (x * 1.0)", (), ("`dy * 0.5`", "1/2 times")),
    # part of an expression equal to another quantity's adjoint by chance ends no walk: the line of dvar, not the
    # line after it (which an edit there could compensate)
    (layernorm_variance_route_power_of_r, "layernorm", "dvar = (dxhat * xmu)", ("dx = dxhat * r", "xmu = "),
     ("must be dL/d(var)", "a fix: `r ** 3` for `r ** 2`")),
    # a gain bound where its gradient belongs, of another shape; a row statistic over the rows, by its adjoint
    (layernorm_gain_for_its_gradient, "layernorm", "dxhat = gamma", ("dx = r *", "m1 = "),
     ("binds `gamma`", "lacks its leading axis")),
    (layernorm_std_route_mean_gradient_over_rows, "layernorm", "dmu = -dxmu.sum(axis=0", ("dx = dxmu",),
     ("dL/d(mu)", "over another axis")),
    # a quantity of the student's own forward side, wrong: its line, not the line that uses it
    (gelu_tanh_identity_doubled, "gelu_tanh", "t = 4.0 * gate", ("return dy *", "du = "), ("2 times",)),
    # a factor extra at the end of a product: the product named, not its first factor
    (gelu_tanh_product_halved_twice, "gelu_tanh", "return dy *", (), ("`0.5 * x * (1 - t * t) * du * 0.5`",
                                                                     "1/2 times")),
    # a step of numformer's missing: the line holding the value it is computed from, with both named by their code
    (attention_dropout_backward_forgotten, "attention", "dp = dout @ v", ("ds = p * (dp", "dv = "),
     ("a step missing after", "numformer's `dout @ v.swapaxes(-1, -2)`", "numformer's `dropout_backward(dp)`")),
    # ... where numformer's name is not bound again after it, the step is missing where the name is read: numformer's
    # returns `dz * weight[:, None]`, the student's return (not the in-place line before it, whose dz is numformer's)
    (loss_weight_forgotten, "loss", "return dz", ("dz = p - eps", "dz[np.arange"), ("returns `dz` where",
                                                                                 "`dz * weight[:, None]`")),
    # a count bound to a name that is one size where the code needs another: its line, not the formula using it
    (layernorm_features_read_off_the_rows, "layernorm", "d = xhat.shape[0]", ("dx = r / d",),
     ("(n) where your code needs d",)),
    # a gradient bound over one nothing read, where their sum belongs: the assignment, not the lines passing it on
    (multihead_value_gradient_assigned_over_the_keys, "multihead", "dmem = self.w_v", ("return dx + dmem", "dx = self.w_q",
                                                                                        "return (dx, dmem)"),
     ("over one nothing read", "dkv", "your `dmem` of line")),
    (residual_branch_assigned_over_the_skip, "residual", "dx = self.norm.backward(d_sub)", ("return (dx,)", "dx = dy"),
     ("over one nothing read", "the sum of the two")),
    # two mistakes, the first numformer's counterpart (the same operation on the same values), the second a first
    # wrong step once the first is made: both named, the first first
    (loss_smoothing_added_and_divided_by_the_weights, "loss", "dz = p + eps / v", ("dz[np.arange", "dz = dz * weight"),
     ("computes it differently",)),
    # ... but not where the student's code computes that value and reads the one before it
    (attention_dropped_gradient_computed_and_not_used, "attention", "ds = p * (dp_raw",
     ("dp_raw = dout", "dp = dropout_backward", "dv = "), ()),
    # a right value returned in another's place: the line binding it, not the return
    (positions_input_gradient_summed_like_the_table, "learned_positions", "dx = dy.sum(axis=lead)",
     ("return (grad, dx)", "grad[offset:"), ("a value numformer's computes for another place",)),
    # a factor fitted at a co-factor holds only with the others right: the dvar beside `2.0 * xc` is wrong (the line
    # before it short a std), so the quotient's line is named, with the adjoint it must be
    (layernorm_std_route_quotient_short_a_std, "layernorm", "d_sd = -(up * xc)", ("d_xc = up / sd", "xc = xhat * sd"),
     ("dL/d(xp.sqrt(var + eps))",)),
    # a returned value of another shape (a number for dbeta) is matched through the reduction that made it
    (layernorm_bias_gradient_summed_to_a_number, "layernorm", "shift = dy.sum()", ("gain = ", "dx = r *"),
     ("summed over its axis 0 as well", "keep that axis")),
]


@pytest.mark.parametrize("fn, exercise, snippet, right, words", NAMED, ids=[n[0].__name__ for n in NAMED])
def test_the_line_named_is_the_mistake_and_no_right_line(fn, exercise, snippet, right, words, tmp_path):
    path, result = _checked(fn, exercise, tmp_path)
    text = str(result)
    first = _first(result)
    assert first.line == _line(path, snippet), text
    right_lines = {_line(path, s) for s in right}
    assert not any(s.line in right_lines for s in result.steps if s.proven), text
    assert not any(set(s.lines) & right_lines and not s.proven for s in result.steps), text
    for word in words:
        assert word in first.said, (word, first.said)
    assert "`x * 2.0`" not in text
    assert "enters 2.33333 times" not in text and "enters 0.666667 times" not in text  # the terms, weighed: gone


def test_a_quantity_of_the_students_own_forward_side_is_named_with_the_line_it_feeds(tmp_path):
    """The Jacobian of a softmax backward built by the student (no value of numformer's is one) is wrong: the line
    that multiplies by it, right as code, is never named alone ("computes the returned dx differently")."""
    path, result = _checked(softmax_jacobian_without_the_identity, "softmax", tmp_path)
    jac, product = _line(path, "jac = "), _line(path, "return (jac @")
    assert not any(s.proven and s.line == product for s in result.steps), str(result)
    assert any(jac in s.lines for s in result.steps), str(result)


def test_a_constant_of_the_students_own_is_named_with_the_line_using_it(tmp_path):
    """sqrt(2) for sqrt(2 / pi) on its own line: the line of du using it, right as code, is never named alone."""
    path, result = _checked(gelu_tanh_constant_wrong, "gelu_tanh", tmp_path)
    constant, du = _line(path, "c = np.sqrt(2)"), _line(path, "du = c *")
    assert not any(s.proven and s.line == du for s in result.steps), str(result)
    assert any(constant in s.lines for s in result.steps), str(result)


def test_float32_inside_the_backward_is_named_with_its_lines(tmp_path):
    path, result = _checked(layernorm_two_casts_to_float32, "layernorm", tmp_path)
    first = _first(result)
    assert set(first.lines) == {_line(path, "dxhat = (dy * gamma).astype"), _line(path, "spread = ")}, str(result)
    assert "computes in float32" in first.said and "differs at 0 of" not in str(result)
    assert "minus" not in str(result), str(result)


def test_no_sentence_sets_two_equal_names_against_each_other(tmp_path):
    """"it uses `dy` where numformer's uses dy": the decoder layer's numformer reuses the name dy for every residual's
    gradient; a sentence names numformer's value by its code then, or says it is another value."""
    _, result = _checked(decoder_cross_attention_given_dy, "decoder_layer", tmp_path)
    for sentence in [s.said for s in result.steps] + [str(result)]:
        for used, their in re.findall(r"uses? `([^`]+)`[^;]*? where numformer's (?:uses|passes) ([\w`.]+)", sentence):
            assert used != their.strip("`"), sentence


def test_a_catalogued_mistake_is_located_too(tmp_path):
    """The catalogue names what the mistake is (``assigned_not_added``), the first wrong step where: the line writing
    the table over what other uses added, not the buffer's line before it (an argument in its place would do too,
    the rest of the code as written; the value the table must hold is numformer's). Before issue 67's second part a
    catalogued mistake had no line at all."""
    ex = exercises.get("embedding")
    path = lab_files.write(ex, embedding_table_written_whole, tmp_path)
    result, status, _ = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result.mistake == "assigned_not_added", str(result)
    first = _first(result)
    assert first.line == _line(path, "grad[...] = rows"), str(result)
    assert not any(s.line == _line(path, "rows = np.zeros_like") for s in result.steps), str(result)
    assert "the argument `grad`" in first.said and "add into it" in first.said, first.said


def test_two_lines_that_could_each_hold_the_mistake_are_said_unproven(tmp_path):
    """A softmax on its own Jacobian, the Jacobian wrong: both lines, as one hedge ("lines 64 or 65, not proven
    which"), never "line 64 or line 65" (read as a blame of the first)."""
    path, result = _checked(softmax_jacobian_without_the_identity, "softmax", tmp_path)
    hedged = [s for s in result.steps if not s.proven and len(s.lines) > 1]
    assert hedged and "not proven which" in hedged[0].said, str(result)
    assert re.search(r"the mistake is on lines \d+(, \d+)* or \d+", hedged[0].said), hedged[0].said


def relu_rounded_to_float32(dy, x):
    on = x > 0
    return np.where(on, dy.astype(np.float32), 0.0)


def test_float32_is_named_where_the_grade_is_approximate(tmp_path):
    """A cast to float32 in ReLU's backward loses only float32's rounding, within the tolerance: graded APPROXIMATE,
    and the line casting named (it said "a step loses precision", no line, before)."""
    ex = exercises.get("relu")
    path = lab_files.write(ex, relu_rounded_to_float32, tmp_path)
    result, status, _ = lab.check_file(str(path), finite_differences=False)
    assert status == 0 and result.passed and not result.exact, str(result)
    first = _first(result)
    assert first.line == _line(path, "return np.where(on, dy.astype"), str(result)
    assert "computes in float32" in first.said and "(see the diagnosis)" in result.summary()


def test_two_mistakes_hiding_each_other_are_both_named(tmp_path):
    path, result = _checked(loss_smoothing_added_and_divided_by_the_weights, "loss", tmp_path)
    lines = [s.line for s in result.steps if s.proven]
    assert lines == [_line(path, "dz = p + eps / v"), _line(path, "return dz / weight.sum()")], str(result)


@pytest.mark.parametrize("fn, exercise, first, second", [
    (attention_mask_kept_and_keys_unscaled, "attention", "g = np.where(masked, g, 0.0)", "dk = np.swapaxes(g"),
    (layernorm_gain_over_features_and_projection_summed, "layernorm", "gain = (xhat * dy).sum(axis=-1)",
     "proj = (up * xhat).sum"),
    (layernorm_upstream_for_its_gain_gradient_and_mean_over_rows, "layernorm", "g_hat = dy", "along = (g_hat"),
], ids=["attention_numbers_aside", "layernorm_a_shape_the_layer_refuses", "layernorm_a_name_bound_to_the_argument"])
def test_two_mistakes_are_both_named_where_one_alone_fixes_nothing(fn, exercise, first, second, tmp_path):
    """The first of two found as numformer's counterpart though their operands differ by a number (numformer's
    ``xp.asarray(0, ...)`` a value of its own, the student's ``0.0`` none); or as a fix putting its own tensor right
    where the other one's shape makes the layer raise (dgamma (n,), which no weight of (d,) takes): with it made, the
    second is a first wrong step."""
    path, result = _checked(fn, exercise, tmp_path)
    lines = [s.line for s in result.steps if s.proven]
    assert lines == [_line(path, first), _line(path, second)], str(result)


@pytest.mark.parametrize("fn, lines", [
    (decoder_returns_swapped, ("return (to_memory, to_input)",)),
    (decoder_returns_swapped_and_skip_added_again, ("return (to_memory, to_input)", "after_ffn = dy + self")),
], ids=["swapped", "swapped_and_another"])
def test_returned_values_in_each_others_place_are_named_at_the_return(fn, lines, tmp_path):
    """Two returned values whose shapes are numformer's the other way round: every case is a shape error, which gave
    no step at all (a catalogued error named, no line); the return is named, and with the swap made (each replay
    returning the other's value as bound then) a second mistake is a first wrong step of what remains."""
    ex = exercises.get("decoder_layer")
    path = lab_files.write(ex, fn, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result is not None, message
    steps = [s for s in result.steps if s.proven]
    assert [s.line for s in steps] == [_line(path, snippet) for snippet in lines], str(result)
    assert "in each other's place" in steps[0].said and "swap them" in steps[0].said


@pytest.mark.parametrize("fn, lines", [
    (encoder_sublayers_handed_to_each_others_residual, ("through_ffn = self.ffn_residual", "return self.self_attn")),
    (encoder_attention_given_the_ffn, ("return self.self_attn_residual",)),
], ids=["both", "one"])
def test_a_sublayer_handed_to_the_wrong_residual_is_named_at_its_call(fn, lines, tmp_path):
    """What a child's backward must be passed is known: the sub-layer numformer's call of that child passes. Before,
    no step was proven and three lines were hedged (the arrays all unknown)."""
    ex = exercises.get("encoder_layer")
    path = lab_files.write(ex, fn, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result is not None, message
    steps = [s for s in result.steps if s.proven]
    assert [s.line for s in steps] == [_line(path, snippet) for snippet in lines], str(result)
    assert all("where numformer's passes `self." in s.said for s in steps)


def test_a_sum_over_one_of_two_leading_axes_is_caught_and_its_line_named(tmp_path):
    """The learned positions' notes allow any number of leading axes, and no case had two: summing the first alone
    graded EXACT. The case with x (2, 3, 4, 8) raises there; the raising line's reduction is named short of an axis."""
    ex = exercises.get("learned_positions")
    path = lab_files.write(ex, positions_summed_over_the_first_axis_only, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result is not None and not result.exact, message
    line = _line(path, "+= dy.sum(axis=0)")
    assert result.raised_at is not None and f"short of an axis" in result.raised_at, str(result)
    assert f"the reduction on your line {line} is wrong" in result.raised_at


def test_a_value_of_numformers_helper_standing_for_its_result_is_named_at_its_line(tmp_path):
    """``p * dp`` equals softmax_backward's own ``dy * y``: taken as right, it ended the walk and the masking after it
    (right) was blamed. A value of a helper of numformer's alone ends no walk; the catalogue names the mistake too."""
    ex = exercises.get("attention")
    path = lab_files.write(ex, attention_softmax_backward_as_the_product_alone, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert status == 1 and result is not None, message
    steps = [s for s in result.steps if s.proven]
    assert [s.line for s in steps] == [_line(path, "d_scores = p * dp")], str(result)
    assert "dS (the softmax's backward of dP)" in steps[0].said


def embedding_scale_left_out_in_a_loop(grad, ids, dy, scale: float):
    # one row at a time, the scale left out: the loop's records are one per row (no key in every call)
    for t, i in enumerate(ids):
        grad[i] += dy[t]
    return grad


def residual_pre_ln_skip_left_out(self, dy, sublayer):
    # pre-LN: y = x + Dropout(Sublayer(LN(x))); the skip's dy is left out of dx (post-LN right)
    if not self.pre_norm:
        dz = self.norm.backward(dy)
        got = sublayer.backward(self.dropout.backward(dz))
        if isinstance(got, tuple):
            return (dz + got[0],) + tuple(got[1:])
        return dz + got
    got = sublayer.backward(self.dropout.backward(dy))
    g_in = got[0] if isinstance(got, tuple) else got
    dx = self.norm.backward(g_in)
    return (dx, *got[1:]) if isinstance(got, tuple) else dx


def linear_weight_gradient_einsum_transposed(dy, x, w, with_bias: bool):
    # the einsum's output indices swapped: dW (d_out, d_in), numformer's transposed (a view of it, but returned)
    dx = dy @ w.T
    dW = np.einsum("nk,nj->jk", x, dy)
    db = dy.sum(axis=0) if with_bias else None
    return dx, dW, db


def relu_multiplied_in_the_float32_of_its_mask(dy, positive):
    # the mask cast to float32 loses nothing (0 and 1); the product computed in its dtype rounds dy
    gate = positive.astype(np.float32)
    dx = np.multiply(dy, gate, dtype=gate.dtype)
    return dx


def multihead_query_path_alone(self, dy):
    # self-attention returns the query path's dx alone; numformer's dx is that value too, and it returns dx + dkv
    grads = self.attention.backward(self._split(self.w_o.backward(dy)))
    dq, dk, dv = (self._merge(g) for g in grads)
    dx = self.w_q.backward(dq)
    d_from_k = self.w_k.backward(dk)
    d_from_v = self.w_v.backward(dv)
    if self._cross:
        return (dx, d_from_k + d_from_v)
    return dx


def gelu_tanh_own_tanh_argument_unbracketed(dy, x, gate):
    # the student's own tanh(u), u written c x + K x^3 (c on x alone): no value of numformer's is their t, but two
    # uses read it, and the one affine in it (1 + t) must be 2 gate: t solved from it puts every gradient right
    c = np.sqrt(2.0 / np.pi)
    t = np.tanh(c * x + 0.044715 * x ** 3)
    inner = c * (1.0 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t ** 2) * inner)


def residual_dropout_skipped_on_the_sublayer(self, dy, sublayer):
    # the sub-layer handed dy itself: the dropout's backward left out (a method of a parameter, not of self)
    if not self.pre_norm:
        dy = self.norm.backward(dy)
    out = sublayer.backward(dy)
    if isinstance(out, tuple):
        d_branch, d_mem = out
    else:
        d_branch, d_mem = out, None
    if self.pre_norm:
        d_branch = self.norm.backward(d_branch)
    dx = dy + d_branch
    return dx if d_mem is None else (dx, d_mem)


def relu_mask_from_the_upstream_gradient(dy, positive):
    # the active set rebuilt from dy's sign, not the forward's: a mask equal to an argument > 0 is no right mask
    through = dy > 0
    return dy * through


def multihead_value_path_computed_and_dropped(self, dy):
    # the value projection's backward runs (its weights get their gradient), its input gradient is dropped
    g_q, g_k, g_v = self.attention.backward(self._split(self.w_o.backward(dy)))
    dx = self.w_q.backward(self._merge(g_q))
    d_kv = self.w_k.backward(self._merge(g_k))
    self.w_v.backward(self._merge(g_v))
    if self._cross:
        return (dx, d_kv)
    return dx + d_kv


@pytest.mark.parametrize("fn, exercise, snippet, right, words", [
    # the name returned holds what the loop left in it: the loop's line is the step, not `return grad` (named
    # together with it, "not proven which")
    (embedding_scale_left_out_in_a_loop, "embedding", "grad[i] += dy[t]", "return grad", ()),
    # a conditional's branch passed on is never right by its value (the returned `... else dx` equals numformer's
    # branch of the pre-LN sum, not its dx): the line binding dx is named, with the step missing after it
    (residual_pre_ln_skip_left_out, "residual", "dx = self.norm.backward(g_in)", "return (dx, *got", ()),
    # a returned value in numformer's transposed layout is no right view: its einsum is named (was: "no step of it
    # is proven wrong", the return line listed)
    (linear_weight_gradient_einsum_transposed, "linear", "dW = np.einsum(", "return (dx, dW, db)",
     ("transposed", "swap its last two axes")),
    # float32 named where it rounds (the product), not at the mask's exact cast (was: the cast)
    (relu_multiplied_in_the_float32_of_its_mask, "relu", "dx = np.multiply(", "gate = positive.astype", ("float32",)),
    # numformer's own name `dx` holds the query path's value and is not bound again: the return is the step (was:
    # "binds dx to ... a value numformer's computes for another place" at the right line before it)
    (multihead_query_path_alone, "multihead", "    return dx", "dx = self.w_q.backward(dq)", ("`dx + dkv`",)),
    # a quantity of the student's own forward side, solved from a use affine in it (was: "lines 61 or 63, not
    # proven which"); the fix suggested is the bracket
    (gelu_tanh_own_tanh_argument_unbracketed, "gelu_tanh", "t = np.tanh(", "return dy *",
     ("numformer's `2 * gate`", "`c * (x + 0.044715 * x ** 3)`")),
    # a name handed to a parameter's backward (``sublayer.backward(dy)``) is recorded at that use, as one handed to
    # a child of self's: it is what holds numformer's dz where the dropout's backward of it belongs (was: "no step
    # of it is proven wrong", five lines listed)
    (residual_dropout_skipped_on_the_sublayer, "residual", "out = sublayer.backward(dy)", "dx = dy + d_branch",
     ("`self.dropout.backward(dz)`",)),
    # a mask of the student's where the code needs the one the exercise gives: its line (was: the product after it)
    (relu_mask_from_the_upstream_gradient, "relu", "through = dy > 0", "return dy * through",
     ("the argument `positive`",)),
    # a child's backward whose result nothing reads, where the code needs it added: the binding beside it (was: the
    # return first, "a value numformer's computes for another place" second)
    (multihead_value_path_computed_and_dropped, "multihead", "d_kv = self.w_k", "return dx + d_kv",
     ("drops another", "whose result nothing reads")),
], ids=["loop_over_rows", "conditional_passed_on", "returned_transposed", "float32_where_it_rounds",
        "numformers_name_not_bound_again", "own_forward_quantity_solved", "name_handed_to_a_parameters_backward",
        "mask_where_an_argument_belongs", "a_childs_result_dropped"])
def test_the_step_is_named_where_the_value_goes_wrong(fn, exercise, snippet, right, words, tmp_path):
    ex = exercises.get(exercise)
    path = lab_files.write(ex, fn, tmp_path)
    result, status, message = lab.check_file(str(path), finite_differences=False)
    assert result is not None and not result.exact, message  # (float32: APPROXIMATE, exit status 0)
    steps = [s for s in result.steps if s.proven]
    assert [s.line for s in steps] == [_line(path, snippet)], str(result)
    assert not any(_line(path, right) in s.lines for s in result.steps), str(result)
    for word in words:
        assert word in steps[0].said, (word, steps[0].said)
