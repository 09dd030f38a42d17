"""An exception inside the student's backward is told in the exercise's terms (grad_checks/raised_line.py): the
raising line, each name it reads with its shape and what it is in numformer's backward, and, where numformer
returns several arrays, that it returns them apart (issue 61: the encoder-decoder branch forgotten surfaced as a
bare broadcast ValueError)."""
import lab_files
from grad_checks import exercises
from grad_checks.grading import grade
from grad_checks.student_file import student_code
from numformer.user_code import load_file


def one_gradient_for_every_case(self, dy):  # the encoder-decoder branch forgotten
    dq, dk, dv = self.attention.backward(self._split(self.w_o.backward(dy)))
    dx = self.w_q.backward(self._merge(dq))
    dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))
    return dx + dkv


def a_product_of_the_wrong_shapes(dy, xhat, r, gamma):
    dxhat = dy * gamma
    mixed = dxhat @ xhat
    return mixed, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def _graded(name, fn, tmp_path):
    ex = exercises.get(name)
    path = lab_files.write(ex, fn, tmp_path)
    return grade(ex, student_code(load_file(path), ex), file=path, finite_differences=False), path


def _line(path, text) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


def test_the_forgotten_encoder_decoder_branch_names_both_gradients(tmp_path):
    result, path = _graded("multihead", one_gradient_for_every_case, tmp_path)
    assert result.raised_at == (
        f"case 3 (encoder-decoder, 2 heads, d_k 3, d_v 5) raised at {path.name}:{_line(path, 'return dx + dkv')} "
        "(`return dx + dkv`), where `dx` (3, 5, 8) is the first array numformer returns (`dx`); `dkv` (3, 6, 8) is "
        "the second array numformer returns (`dkv`); in this case numformer returns 2 arrays apart, (`dx`, `dkv`)")
    assert f"diagnosis: {result.raised_at}" in str(result)


def test_a_raising_line_names_its_operands_as_numformer_has_them(tmp_path):
    result, path = _graded("layernorm", a_product_of_the_wrong_shapes, tmp_path)
    assert result.raised_at is not None
    assert f"raised at {path.name}:{_line(path, 'mixed = dxhat @ xhat')} (`mixed = dxhat @ xhat`)" in result.raised_at
    assert "`dxhat` (18, 8) is numformer's `dxhat`" in result.raised_at
    assert "`xhat` (18, 8) is the argument xhat" in result.raised_at
    assert "apart" not in result.raised_at  # it mixes no two of numformer's returned arrays


def test_a_right_answer_and_a_wrong_one_that_runs_have_no_raised_line(tmp_path):
    ex = exercises.get("multihead")
    result, _ = _graded("multihead", ex.target, tmp_path)
    assert result.exact and result.raised_at is None


def softmax_row_sum_without_keepdims(dy, y):  # the row sum (n..., T) broadcast against (n..., T, T'): raises
    inner = (dy * y).sum(axis=-1)
    return y * (dy - inner)


def test_a_name_of_numformers_value_without_its_kept_axis_names_the_line_computing_it(tmp_path):
    """Issue 67: the raising line only reads the row sum; the mistake is where it is computed, keepdims left out. Its
    value is numformer's with the axis of length 1 dropped, so it is matched through that axis (before: "no array
    numformer computes here", no line of the mistake)."""
    result, path = _graded("softmax", softmax_row_sum_without_keepdims, tmp_path)
    assert result.raised_at is not None, str(result)
    assert "is no array numformer computes here" not in result.raised_at
    assert "without its axis of length 1" in result.raised_at
    assert f"keepdims=True belongs on your line {_line(path, 'inner = (dy * y).sum(axis=-1)')}" in result.raised_at
