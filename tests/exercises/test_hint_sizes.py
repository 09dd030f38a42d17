"""The hint for a gradient that is close to numformer's but not within the tolerance (grad_checks/grading.py's
_describe_wrong) fits the size of the error: float32 is suggested only within float32's rounding
(FLOAT32_ROUNDING, 7.6e-6); an error of 1e-4 to 1e-3 is a small term or constant, not a precision (issue 61: a
student was asked "is a step computed in float32?" at 7.7e-4)."""
import numpy as np

import lab_files
from grad_checks import exercises
from grad_checks.grading import FLOAT32_ROUNDING, grade
from grad_checks.student_file import student_code
from numformer.user_code import load_file


def a_step_in_float32(dy, xhat, r, gamma):
    import numpy as np
    dxhat = (dy * gamma).astype(np.float32)  # one intermediate rounded to float32
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dgamma, dbeta


def an_epsilon_in_the_wrong_place(dy, xhat, r, gamma):
    dgamma = (dy * xhat).sum(axis=0)
    dbeta = dy.sum(axis=0)
    dxhat = dy * gamma
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx + 2e-5 * dy * r, dgamma, dbeta  # a small extra term


def _hints(fn, tmp_path):
    ex = exercises.get("layernorm")
    path = lab_files.write(ex, fn, tmp_path)
    result = grade(ex, student_code(load_file(path), ex), file=path, finite_differences=False)
    assert not result.passed
    return " ".join(result.hints), max(t.error for c in result.cases for t in c.tensors)


def test_a_float32_step_is_told_float32(tmp_path):
    hints, worst = _hints(a_step_in_float32, tmp_path)
    assert worst <= FLOAT32_ROUNDING
    assert "computed in float32" in hints


def test_an_error_far_above_float32_rounding_is_not_told_float32(tmp_path):
    hints, worst = _hints(an_epsilon_in_the_wrong_place, tmp_path)
    assert 1e-5 < worst <= 1e-3, worst
    assert "float32" in hints and "computed in float32" not in hints  # float32 named only as what it is not
    assert "a small term missing or extra" in hints
