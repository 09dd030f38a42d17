"""Wrong backward passes written by hand as students write them, each with the first wrong step it must be told.

The grader's diagnosis of issue 41 names the *first wrong step* of a student's backward: it records the arrays
that numformer's reference backward and the student's compute along the way (every array-valued
sub-expression and every bound local, with its line), matches them by value (up to a transpose, a reshape or a
scalar factor) and reports the first intermediate of the reference, in its order of evaluation, that the
student computes wrongly or never computes: the first one whose own operands the student has right but whose
value the student never reproduces. tests/exercises/test_first_wrong_step.py grades every solution here as a
student's file and checks that diagnosis against the expectation written beside it.

The solutions are not the exercises' catalogued mistakes (``ex.mistakes``: those are named before any step is
sought) and not single edits of the reference (grad_checks/mutants.py: those are the mutation tests' business).
They are what students hand in: their own names for the intermediates, a route of their own to part of the
result (a Jacobian, the smoothed target built whole, a sort and ``reduceat``, a column of ones), two mistakes at once, one-liners.
Each uses only numpy and its arguments, with the reference's exact signature.

Each expectation is derived from the mistake, not copied from what a grader prints (:class:`Expect`):

* ``step``: the reference's first intermediate the student gets wrong, as the name the reference binds it to
  (``dxhat``, ``dbeta``) or as its source text in numformer's reference (``ast.get_source_segment``: ``dy * y``,
  ``ds @ k``); the source text whenever the name is bound more than once (attention's ``ds``, the loss's ``dz``).
  A returned value is a step too, compared as returned (a transposed dW is not dW). "Never reproduces" is over
  the cases where the student's gradients are wrong: three attention solutions go wrong only in the case with
  attention dropout.
* ``line``: a snippet of the student's line (as ``ast.unparse`` writes it: tests/lab_files.py unparses) that
  computes the student's counterpart of that step, the value in the step's place in their code; None when
  their code has nothing in that place (a route that never forms it).
* ``own``: a snippet of the student's line a route of their own is located at (grad_checks/own_route.py: one edit
  of that line makes every gradient right, none of another line does), when it is not ``line``'s;
* ``second``: the other step, for two independent mistakes; ``factor``: the symbol (per exercise, from the
  function's arguments: the test's vocabulary) or the constant the student's counterpart is numformer's times;
  ``pattern``: where the wrong entries are, in the exercise's terms; ``note``: the mistake as a teacher says it.

Both files of solutions (this one: the row-wise and elementwise exercises; student_mistakes_layers.py:
attention, the embeddings, linear, multi-head) append to :data:`SOLUTIONS` through :func:`expect`; a registry,
not a decorator, because the test writes each function's source into a student's file and a decorator line
would go with it.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Expect:
    """What the first-wrong-step diagnosis must say about one solution (see the module docstring)."""

    fn: object
    exercise: str
    step: str
    line: str | None
    second: str | None = None
    factor: str | None = None
    pattern: str | None = None
    note: str = ""
    own: str | None = None

    @property
    def own_line(self) -> str | None:
        """The snippet of the line a diagnosis of the student's own route must name."""
        return self.own or self.line


SOLUTIONS: list = []


def expect(fn, exercise, *, step, line, second=None, factor=None, pattern=None, note="", own=None):
    """Register ``fn`` with its expected diagnosis; ``line`` is required (None: nothing in that place in their code)."""
    SOLUTIONS.append(Expect(fn, exercise, step, line, second, factor, pattern, note, own))
    return fn


# ---- softmax: dx = y * (dy - sum(dy * y)) over the last axis -------------------------------------------------

def softmax_row_sum_of_dy_squared(dy, y):
    s = (dy * dy).sum(axis=-1, keepdims=True)
    return y * (dy - s)


def softmax_recomputed_from_output(dy, y):
    # y taken for the scores: the softmax is applied again, and every later step uses these probabilities
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    weighted = (dy * probs).sum(axis=-1, keepdims=True)
    return probs * (dy - weighted)


def softmax_row_sum_scaled_by_dy(dy, y):
    s = (dy * y).sum(axis=-1, keepdims=True)
    return dy * (y - s)


def softmax_jacobian_diagonal_twice(dy, y):
    # the (n, n) Jacobian built: its diagonal already holds y_i (1 - y_i), and the outer product takes y_i^2
    # off it a second time
    outer = y[..., :, None] * y[..., None, :]
    diagonal = y * (1.0 - y)
    jac = diagonal[..., :, None] * np.eye(y.shape[-1]) - outer
    return (dy[..., None, :] @ jac)[..., 0, :]


def softmax_rows_reshaped_wrong_way(dy, y):
    # (n, -1) where (-1, n) was meant: each "row" of the reshape runs across several softmax rows
    n = y.shape[-1]
    rows_y = y.reshape(n, -1)
    rows_dy = dy.reshape(n, -1)
    s = (rows_dy * rows_y).sum(axis=1, keepdims=True)
    return (rows_y * (rows_dy - s)).reshape(y.shape)


expect(softmax_row_sum_of_dy_squared, "softmax", step="dy * y", line="(dy * dy)",
       note="the row sum weighs dy by y (sum of dy * y), not by dy itself")
expect(softmax_recomputed_from_output, "softmax", step="y", line="e = np.exp(y - y.max(axis=-1, keepdims=True))",
       note="y is already the softmax's output: applying the softmax to it again gives other weights; the mistake "
            "is the line recomputing it, not the line using it (issue 61: numformer's y there, and all is right; "
            "issue 67: the first line of the two that recompute it, exp(y) where y belongs, the normalisation after "
            "it then right)")
expect(softmax_row_sum_scaled_by_dy, "softmax", step="y * (dy - (dy * y).sum(axis=-1, keepdims=True))",
       line="dy * (y - s)", note="the row-sum term is multiplied by dy instead of y: dx = y * (dy - s); y - s is a "
       "value no one computes, so the smallest expression whose value is known is the returned dx (issue 67)")
expect(softmax_jacobian_diagonal_twice, "softmax", step="dy * y", line=None, own="diagonal = y * (1.0 - y)",
       note="the Jacobian diag(y) - y y^T already has y_i (1 - y_i) on its diagonal: y_i^2 is taken off twice")
expect(softmax_rows_reshaped_wrong_way, "softmax", step="(dy * y).sum(axis=-1, keepdims=True)",
       line="(rows_dy * rows_y).sum(axis=1, keepdims=True)",
       note="reshape(n, -1) mixes the rows: the sum must run over each softmax row, the last axis")


# ---- the label-smoothed cross-entropy: dz = (p - eps / V - (1 - eps) onehot) * weight[:, None] ---------------
# Every solution indexes the targets with np.arange over the rows, as numformer does: the integer index array is
# an intermediate too, and a route without it would be "wrong" there first.

def loss_uniform_part_outside_the_weight(p, y, eps, weight):
    n, v = p.shape
    dz = p.copy()
    dz[np.arange(n), y] -= 1.0 - eps
    return dz * weight[:, None] - eps / v


def loss_classes_counted_as_rows(p, y, eps, weight):
    # len(p) is the number of rows (tokens), not the number of classes
    n = len(p)
    dz = p - eps / n
    dz[np.arange(n), y] -= 1.0 - eps
    return dz * weight[:, None]


def loss_padding_rows_kept(p, y, eps, weight):
    # the mean over the real tokens, but padding rows keep their gradient (and the caller's normalizer is lost)
    n, v = p.shape
    dz = p - eps / v
    dz[np.arange(n), y] -= 1.0 - eps
    tokens = np.count_nonzero(weight)
    return dz / tokens


def loss_normalised_twice(p, y, eps, weight):
    # weight already holds 1 / normalizer: dividing by the token count again
    n, v = p.shape
    dz = p - eps / v
    dz[np.arange(n), y] -= 1.0 - eps
    tokens = np.count_nonzero(weight)
    per_token = dz / tokens
    return per_token * weight[:, None]


def loss_gradient_of_the_probabilities(p, y, eps, weight):
    # d(-sum q log p)/dp: the gradient with respect to p, where the logits z were asked for
    n, v = p.shape
    q = np.full_like(p, eps / v)
    q[np.arange(n), y] += 1.0 - eps
    return -q / p * weight[:, None]


expect(loss_uniform_part_outside_the_weight, "loss", step="dz * weight[:, None]", line="- eps / v",
       note="the smoothing's eps / V is left outside the weight: padding rows get -eps / V, real rows it unweighted; "
            "the student's dz (p - onehot (1 - eps)) is a right value of their own route (issue 67: the returned "
            "expression is the one whose value is known, its inputs right)")
expect(loss_classes_counted_as_rows, "loss", step="p - eps / p.shape[1]", line="p - eps / n",
       note="eps is spread over the V classes (p.shape[1]); len(p) counts the rows")
expect(loss_padding_rows_kept, "loss", step="dz * weight[:, None]", line="dz / tokens",
       note="the per-row weight is forgotten: padding rows get gradient and the normalizer given is ignored")
expect(loss_normalised_twice, "loss", step="dz[xp.arange(p.shape[0]), y] -= 1.0 - eps", line="dz / tokens",
       factor="1/tokens", note="weight already divides by the normalizer: dividing by the token count again, at the "
       "line that divides (issue 67: per_token is numformer's p - q times 1/tokens, and with p - q there all is right)")
expect(loss_gradient_of_the_probabilities, "loss", step="dz[xp.arange(p.shape[0]), y] -= 1.0 - eps", line="-q / p",
       note="the gradient is with respect to the logits z (p - q), not the probabilities (-q / p): the smoothed target "
            "q is right (a quantity of the forward side), -q / p stands where p - q belongs")


# ---- LayerNorm: dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma --------------

MEAN = "dxhat.mean(axis=-1, keepdims=True)"
PROJECTION = "(dxhat * xhat).mean(axis=-1, keepdims=True)"
INNER = f"dxhat - {MEAN} - xhat * {PROJECTION}"


def layernorm_sums_where_means_belong(dy, xhat, r, gamma):
    dxhat = dy * gamma
    total = dxhat.sum(axis=-1, keepdims=True)
    proj = (dxhat * xhat).sum(axis=-1, keepdims=True)
    dx = r * (dxhat - total - xhat * proj)
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    return dx, dgamma, dbeta


def layernorm_gain_outside_the_means(dy, xhat, r, gamma):
    # the means taken of dy, and the gain put on afterwards: the means are over the features, which gamma weighs
    n_features = dy.shape[-1]
    centred = dy - dy.sum(axis=-1, keepdims=True) / n_features
    proj = (dy * xhat).sum(axis=-1, keepdims=True) / n_features
    dx = gamma * r * (centred - xhat * proj)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_bias_averaged_and_r_forgotten(dy, xhat, r, gamma):
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.mean(axis=0)
    dxhat = dy * gamma
    m1 = dxhat.mean(axis=-1, keepdims=True)
    m2 = (dxhat * xhat).mean(axis=-1, keepdims=True)
    dx = dxhat - m1 - xhat * m2
    return dx, dgamma, dbeta


def layernorm_r_on_first_term_only(dy, xhat, r, gamma):
    d = xhat.shape[-1]
    dxhat = dy * gamma
    mean_g = dxhat.sum(axis=-1, keepdims=True) / d
    mean_gx = (dxhat * xhat).sum(axis=-1, keepdims=True) / d
    dx = r * (dxhat - mean_g) - xhat * mean_gx
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def layernorm_gain_gradient_from_dxhat(dy, xhat, r, gamma):
    dxhat = dy * gamma
    dgamma = (dxhat * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def layernorm_gain_applied_twice(dy, xhat, r, gamma):
    dxhat = dy * gamma
    inner = dxhat - dxhat.mean(axis=-1, keepdims=True)
    inner = inner - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    dx = gamma * r * inner
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


expect(layernorm_sums_where_means_belong, "layernorm", step=MEAN, line="total = dxhat.sum(axis=-1, keepdims=True)",
       second=PROJECTION, factor="d", note="both row statistics are means over the d features: 1/d forgotten twice")
expect(layernorm_gain_outside_the_means, "layernorm", step="dxhat", line=None,
       note="dxhat = dy * gamma comes first: the means are over the features, so gamma cannot be taken out of them")
expect(layernorm_bias_averaged_and_r_forgotten, "layernorm", step="dbeta", line="dbeta = dy.mean(axis=0)",
       second="dx", factor="1/n", note="two mistakes: dbeta sums over the rows (not a mean), and dx lacks the factor r")
expect(layernorm_r_on_first_term_only, "layernorm", step="dx", line="dx = r * (dxhat - mean_g) - xhat * mean_gx",
       note="r multiplies the whole bracket: the variance path's term needs it too (r * (dxhat - mean_g) is known "
            "nowhere: the returned dx is the smallest expression known wrong)")
expect(layernorm_gain_gradient_from_dxhat, "layernorm", step="dgamma", line="dgamma = (dxhat * xhat)",
       note="dgamma = sum(dy * xhat): dxhat already holds gamma, which does not depend on itself (dxhat * xhat is "
            "a right value numformer's projection uses: the sum of it is the step, used where dy * xhat belongs)")
expect(layernorm_gain_applied_twice, "layernorm", step="dx", line="dx = gamma * r * inner",
       note="gamma entered through dxhat already: multiplying dx by it again counts it twice")


# ---- the elementwise layers --------------------------------------------------------------------------------

def silu_product_rule_with_s_for_x(dy, x, s):
    # d(x * s)/dx = s + x * ds/dx, written from memory with the output's other factor taken for x
    ds = s * (1 - s)
    local = s + s * ds
    return dy * local


def silu_dy_on_one_term_only(dy, x, s):
    ds = s * (1 - s)
    return dy * s + x * ds


def relu_gradient_rectified_alone(dy, positive):
    return np.maximum(dy, 0.0)


def dropout_scale_without_the_mask(dy, mask):
    # the 1/(1 - p) read off the mask, and the mask itself forgotten: dropped entries get gradient
    keep_scale = mask.max()
    return dy * keep_scale


def dropout_empirical_keep_rate(dy, mask):
    # the keep pattern divided by the fraction kept in this draw, not by the 1 - p the forward used
    kept = mask > 0
    return dy * kept / kept.mean()


expect(silu_product_rule_with_s_for_x, "silu", step="x * ds", line="local = s + s * ds",
       note="the product rule's second term is x * ds/dx: the factor left over from x * s is x, not s")
expect(silu_dy_on_one_term_only, "silu", step="dy * (s + x * ds)", line="dy * s + x * ds",
       note="the chain rule multiplies the whole derivative s + x * s (1 - s) by dy, not its first term (dy * s is "
            "known nowhere: the returned dx is the smallest expression known wrong)")
expect(relu_gradient_rectified_alone, "relu", step="dy * positive", line="np.maximum(dy, 0.0)",
       note="the gradient passes where the input was positive (positive), whatever its own sign")
expect(dropout_scale_without_the_mask, "dropout", step="dy * mask", line="dy * keep_scale",
       note="dx = dy * mask: the dropped entries get nothing, the kept ones 1/(1 - p)")
expect(dropout_empirical_keep_rate, "dropout", step="dy * mask", line="kept.mean()",
       note="the mask already holds 1/(1 - p): the fraction kept in one draw is not 1 - p")
