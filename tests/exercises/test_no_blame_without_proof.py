"""Issue 61, items 1 and 2: no blame without proof. A step of a student's backward is named as the first wrong one
only when the grader has proved it, by replaying a backward with one value (or one line) changed:

* numformer's backward, with the student's value at the step, changes the graded gradients the way the student's
  code does (grad_checks/first_wrong_step.py: ``_forward_proof``); or
* the student's own code, with numformer's value at the student's line, gets right every gradient that the change
  touches (``_fix_proof``): that line is the mistake, whatever route the rest of the code takes.

Otherwise the diagnosis says which returned gradients are wrong, where, and which of the student's lines feed them
(a slice of the student's data flow), and names no step. The answers here are written by hand, each with the line
its diagnosis must name, and correct routes by other derivations must grade right:

* Routes of their own (issue 61, item 2), each right as written (graded right, EXACT here) and wrong with one edit
  made in the student's file (``ROUTES``): LayerNorm's backward derived through the variance (dvar, dmu, then dx: the
  textbook route, sharing almost nothing with numformer's closed form) with the power of (var + eps) wrong (-1/2 for
  -3/2), and with the derivative's constant wrong (-3/2 for -1/2); a softmax through the log-softmax with logsumexp's
  gradient taken as y^2; attention as einsums with the row dot product added; the tanh GELU through tanh with
  d(x^3)/dx taken as 3 x^3. Each must be located at its line. Before: the variance route's power was "first wrong
  step: mean(dxhat) ...: your code never computes it", a step the route does not need, then one of five lines
  feeding dx; now an edit of the line proves it (grad_checks/own_route.py).
* SiLU with the sigmoid recomputed from x and its sign lost (1 / (1 + exp(x)) is sigmoid(-x)): used in the product
  rule, the mistake is the line recomputing it; used only in s (1 - s), which is even in x, the answer is right.
  Before: located at the line using it (``x * sig``, "computes ds differently").
* The encoder layer and the residual sub-layer with an extra skip path (``+ dy``): the line adding it is the
  mistake. Before: the encoder layer's was labelled the attention residual's step (``self.self_attn_residual
  .backward(dx, ...)``), the residual's the returned tuple.
"""
import time

import numpy as np
import pytest

import lab_files
from grad_checks import exercises, first_wrong_step, lab
from grad_checks.grading import grade
from grad_checks.student_file import student_code
from numformer.user_code import load_file


# ---- the answers (each with the reference's signature, numpy only) -----------------------------------------------

def layernorm_through_the_variance(dy, xhat, r, gamma):
    # the textbook route: dvar, dmu, then dx; x - mu = xhat / r and var + eps = 1 / r^2
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    d = dy.shape[-1]
    dxhat = dy * gamma
    xmu = xhat / r
    var_eps = 1.0 / r ** 2
    dvar = (dxhat * xmu).sum(axis=-1, keepdims=True) * -0.5 * var_eps ** (-1.5)
    dmu = -(dxhat * r).sum(axis=-1, keepdims=True) + dvar * (-2.0 * xmu).mean(axis=-1, keepdims=True)
    dx = dxhat * r + dvar * 2.0 * xmu / d + dmu / d
    return dx, dgamma, dbeta


def softmax_through_the_log(dy, y):
    # y = exp(z), z = x - logsumexp(x) the log-softmax: dL/dz = dy * y; z's gradient takes y times its row sum off
    dz = dy * y
    dlse = dz.sum(axis=-1, keepdims=True)
    return dz - y * dlse


def attention_by_einsum(dout, q, k, v, p, p_used, masked, scale, dropout_backward=None):
    # every product as an einsum over (batch, head, query, key, feature), the softmax's row dot product too
    dv = np.einsum("bhqk,bhqd->bhkd", p_used, dout)
    dp = np.einsum("bhqd,bhkd->bhqk", dout, v)
    if dropout_backward is not None:
        dp = dropout_backward(dp)
    rowdot = np.einsum("bhqk,bhqk->bhq", dp, p)[..., None]
    ds = p * (dp - rowdot)
    if masked is not None:
        ds = np.where(masked, 0.0, ds)
    dq = np.einsum("bhqk,bhkd->bhqd", ds, k) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q) * scale
    return dq, dk, dv


def gelu_tanh_through_the_tanh(dy, x, gate):
    # gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3); the gate is 0.5 (1 + tanh(u))
    t = 2.0 * gate - 1.0
    du = np.sqrt(2.0 / np.pi) * (1.0 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t ** 2) * du)


def silu_sigmoid_sign_lost(dy, x, s):
    # the sigmoid recomputed from x, its minus lost: sig is sigmoid(-x) = 1 - s
    sig = 1.0 / (1.0 + np.exp(x))
    local = sig + x * sig * (1 - sig)
    return dy * local


def silu_sigmoid_sign_lost_only_in_its_derivative(dy, x, s):
    # the same recomputation, used only in s (1 - s): sigmoid(-x) (1 - sigmoid(-x)) = s (1 - s), a right route
    sig = 1.0 / (1.0 + np.exp(x))
    ds = sig * (1 - sig)
    return dy * (s + x * ds)


def encoder_extra_skip_path(self, dy):
    # a skip path around the whole layer added by hand: each residual already has its own
    dh = self.ffn_residual.backward(dy, self.ffn)
    dh = dh + dy
    return self.self_attn_residual.backward(dh, self.self_attn)


def residual_extra_skip_path(self, dy, sublayer):
    # the upstream gradient added once more, as if the skip path went around the norm as well
    dz = dy if self.pre_norm else self.norm.backward(dy)
    got = sublayer.backward(self.dropout.backward(dz))
    d_sub, extra = (got[0], got[1:]) if isinstance(got, tuple) else (got, ())
    dx = dz + (self.norm.backward(d_sub) if self.pre_norm else d_sub) + dy
    return (dx, *extra) if extra else dx


# routes of their own, each right as written and wrong with one edit: (answer, exercise, (the text as written, as
# the mistake has it), the snippet of the line the diagnosis must name, snippets of lines it must never name)
VARIANCE_RIGHT = ("dxhat = dy * gamma", "xmu = xhat / r", "var_eps = 1.0 / r ** 2", "dgamma =", "dbeta =")
ROUTES = [
    # d(var + eps)^(-1/2) / dvar is -1/2 (var + eps)^(-3/2): the power written -1/2
    (layernorm_through_the_variance, "layernorm", ("var_eps ** (-1.5)", "var_eps ** (-0.5)"), "var_eps ** (-0.5)",
     VARIANCE_RIGHT),
    # the same derivative's constant taken from the power: -3/2 for -1/2
    (layernorm_through_the_variance, "layernorm", ("* -0.5 *", "* -1.5 *"), "* -1.5 *", VARIANCE_RIGHT),
    # logsumexp's gradient taken as y^2
    (softmax_through_the_log, "softmax", ("dz - y * dlse", "dz - y ** 2 * dlse"), "y ** 2 * dlse",
     ("dz = dy * y", "dlse = dz.sum")),
    # the softmax's row dot product added instead of taken off
    (attention_by_einsum, "attention", ("dp - rowdot", "dp + rowdot"), "dp + rowdot",
     ("dv = np.einsum", "dp = np.einsum", "rowdot = np.einsum", "dq = np.einsum", "dk = np.einsum")),
    # d(x^3)/dx taken as 3 x^3
    (gelu_tanh_through_the_tanh, "gelu_tanh", ("x ** 2", "x ** 3"), "x ** 3", ("t = 2.0 * gate - 1.0",)),
]

# (answer, exercise, the snippet of the line the diagnosis must name, snippets of lines it must never name)
WRONG = [(fn, ex, must, never, edit) for fn, ex, edit, must, never in ROUTES] + [
    (silu_sigmoid_sign_lost, "silu", "sig = 1.0 / (1.0 + np.exp(x))", ("local = ", "return dy * local"), None),
    (encoder_extra_skip_path, "encoder_layer", "dh = dh + dy",
     ("self.self_attn_residual.backward(dh", "dh = self.ffn_residual.backward(dy"), None),
    (residual_extra_skip_path, "residual", "else d_sub) + dy", ("return (dx, *extra)", "dz = dy if"), None),
]
RIGHT = [(fn, ex) for fn, ex in dict.fromkeys((fn, ex) for fn, ex, *_ in ROUTES)] + \
    [(silu_sigmoid_sign_lost_only_in_its_derivative, "silu")]

# numformer's right steps the variance route does not take (the old diagnosis blamed the first of them)
NOT_TAKEN = ("dxhat.mean(axis=-1, keepdims=True)", "(dxhat * xhat).mean(axis=-1, keepdims=True)")


def _graded(ex_name, fn, tmp_path, edit=None):
    """The answer written as a student's file (with ``edit``, (text, replacement), made in it) and checked."""
    ex = exercises.get(ex_name)
    path = lab_files.write(ex, fn, tmp_path)
    if edit is not None:
        text = path.read_text(encoding="utf-8")
        assert text.count(edit[0]) == 1, edit
        path.write_text(text.replace(*edit), encoding="utf-8")
    result, status, message = lab.check_file(str(path))
    return ex, path, result, status, message


def _line(path, snippet) -> int:
    """The line (1-based) of the student's code, from its def on, holding ``snippet``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, text in enumerate(lines) if text.lstrip().startswith("def ") and "(" in text
                 and not text.lstrip().startswith("def __"))
    found = [i + 1 for i in range(start, len(lines)) if snippet in lines[i]]
    assert len(found) == 1, (snippet, found)
    return found[0]


def _id(w) -> str:
    return w[0].__name__ + (f"[{w[4][1]}]" if w[4] else "")


@pytest.mark.parametrize("fn, ex_name, must, never, edit", WRONG, ids=[_id(w) for w in WRONG])
def test_the_step_named_is_the_mistake_and_no_right_step_is_blamed(fn, ex_name, must, never, edit, tmp_path):
    ex, path, result, status, message = _graded(ex_name, fn, tmp_path, edit)
    assert status == 1 and result is not None, message
    text = str(result)
    assert "Traceback" not in text and result.mistake is None, text
    right_lines = {_line(path, s) for s in never}
    proven = [s for s in result.steps if s.proven]
    said = [s for s in result.steps if not s.proven]
    for step in proven:  # a step named is the mistake: never one of the lines that are right
        assert step.line not in right_lines, (step.said, text)
        assert step.code not in NOT_TAKEN, step.said
    for step in said:  # an unproven sentence names no step of numformer's as wrong
        assert not step.said.startswith("first wrong step"), step.said
    want = _line(path, must)
    if proven:
        assert proven[0].line == want, (proven[0].said, text)
    else:  # not proven: the wrong entries, and the student's lines feeding them, the mistake's among them
        assert said and any(want in s.lines for s in said), text
        assert all(f"line {want}" in s.said or f"lines" in s.said for s in said), text


@pytest.mark.parametrize("fn, ex_name, edit, must, never", ROUTES, ids=[f"{r[0].__name__}[{r[2][1]}]" for r in ROUTES])
def test_a_route_of_its_own_is_located_at_its_line(fn, ex_name, edit, must, never, tmp_path):
    """The mistake of a route numformer's code does not take is not merely in the slice: the diagnosis proves it at
    its line (issue 61, item 2; before, the variance route's wrong power was one of five lines feeding dx)."""
    _, path, result, _, _ = _graded(ex_name, fn, tmp_path, edit)
    proven = [s for s in result.steps if s.proven]
    assert proven and proven[0].line == _line(path, must), str(result)
    assert f"your line {proven[0].line} (" in proven[0].said and proven[0].said in str(result)


@pytest.mark.parametrize("fn, ex_name", RIGHT, ids=[r[0].__name__ for r in RIGHT])
def test_a_correct_route_by_another_derivation_is_right(fn, ex_name, tmp_path):
    _, _, result, status, message = _graded(ex_name, fn, tmp_path)
    assert status == 0 and result is not None and result.passed, message or str(result)


def test_the_search_stops_at_its_budget_and_says_what_it_had(monkeypatch, tmp_path):
    """Issue 61, left (c): the replays of a slow backward (the variance route with its wrong power, 50 ms a call)
    stop at the budget; the grade says so and shows the wrong entries and the lines feeding them, never a step it
    did not prove."""
    ex = exercises.get("layernorm")
    path = lab_files.write(ex, layernorm_through_the_variance, tmp_path)
    text = path.read_text(encoding="utf-8").replace("var_eps ** (-1.5)", "var_eps ** (-0.5)")
    path.write_text("import time\n" + text.replace("    d = dy.shape[-1]\n", "    time.sleep(0.05)\n    d = dy.shape[-1]\n"),
                    encoding="utf-8")
    budget = 0.3
    monkeypatch.setattr(first_wrong_step, "SEARCH_BUDGET", budget)
    spent = []
    real = first_wrong_step.first_wrong_steps

    def timed(*args, **kwargs):
        start = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.monotonic() - start)
    monkeypatch.setattr("grad_checks.grading.first_wrong_steps", timed)
    result = grade(ex, student_code(load_file(path), ex), file=path, finite_differences=False)
    assert not result.passed and result.steps, str(result)
    assert not any(s.proven for s in result.steps), str(result)
    assert all("stopped at its budget (0.3 s of replays)" in s.said for s in result.steps), str(result)
    assert all(s.lines for s in result.steps)  # the slice: the lines feeding the wrong values
    # the two recordings (3 calls of 50 ms each), then replays until the budget: at most one more started past it
    assert spent and spent[0] < 2 * 0.15 + budget + 0.15 + 0.5, spent
