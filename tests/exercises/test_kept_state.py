"""A backward that keeps state between calls (grad_checks/kept_state.py): the cases run again, backwards, on new
layers; a case whose gradients change with the calls before it is named, with whether it was right as the first
call, and what holds the state with its line. A right answer (every exercise's reference written out) keeps none,
and the second pass costs a right file no verdict."""
import numpy as np
import pytest

import lab_files
from grad_checks import exercises
from grad_checks.grading import grade
from grad_checks import student_file as lab
from grad_checks.student_file import student_code
from numformer.user_code import load_file


def _graded(ex, path):
    return grade(ex, student_code(load_file(path), ex), file=path, finite_differences=False)


def _with_first_lines(ex, tmp_path, lines: str, *, args: str = "", above: str = ""):
    """The reference written out, `lines` put first in its body (`args` added to its signature, `above` before
    it): the written file's path."""
    path = lab_files.write(ex, ex.target, tmp_path)
    text = path.read_text()
    name = ex.target.__name__
    if above:
        text = text.replace(f"def {name}(", f"{above}\n\n\ndef {name}(", 1)
    head = text[text.index(f"def {name}("):].split(":\n", 1)[0]
    text = text.replace(head + ":\n", head[:-1] + args + "):\n" + lines, 1)
    path.write_text(text)
    return path


def _line(path, text) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


def test_a_scratch_buffer_never_zeroed_is_named_with_its_line(tmp_path):
    """The issue's student: a module-level scratch array reused for dgamma and added into, never zeroed. The
    first call is right, later ones wrong; the grade says so and names the buffer at its line."""
    ex = exercises.get("layernorm")
    path = lab_files.write(ex, ex.target, tmp_path)
    text = path.read_text()
    text = text.replace("def layernorm_backward(", "_scratch = {}\n\n\ndef layernorm_backward(", 1)
    text = text.replace("    dgamma = (dy * xhat).sum(axis=0)\n",
                        "    buf = _scratch.setdefault(gamma.shape, np.zeros(gamma.shape))\n"
                        "    buf += (dy * xhat).sum(axis=0)\n"
                        "    dgamma = buf.copy()\n", 1)
    if "import numpy as np" not in text:
        text = "import numpy as np\n" + text
    path.write_text(text)
    result = _graded(ex, path)
    assert not result.passed and result.keeps_state is not None
    assert "case 1 is right as the first call of your backward and wrong after" in result.keeps_state
    assert f"_scratch ({path.name}:{_line(path, '_scratch = {}')}), a module-level name" in result.keeps_state
    assert result.summary().startswith("WRONG: your backward keeps state between calls")
    assert "diagnosis: your backward keeps state between calls" in str(result)


def test_a_mutable_default_argument_is_named(tmp_path):
    ex = exercises.get("relu")
    name = ex.target.__name__
    path = _with_first_lines(ex, tmp_path, "    _calls.append(1)\n    if len(_calls) > 1:\n        dy = dy * 1.5\n",
                             args=", _calls=[]")
    result = _graded(ex, path)
    assert result.keeps_state is not None
    assert f"a default argument of {name} ({path.name}:{_line(path, f'def {name}(')})" in result.keeps_state


@pytest.mark.parametrize("name", exercises.ORDER)
def test_a_right_answer_keeps_no_state(name, tmp_path):
    ex = exercises.get(name)
    path = lab_files.write(ex, ex.target, tmp_path)
    result = _graded(ex, path)
    assert result.keeps_state is None and result.exact


def test_a_hyper_parameter_kept_from_the_first_call_is_named(tmp_path):
    """Issue 67: the smoothing eps cached at module level on the first call. It never changes after that call, so a
    second pass over the cases repeats the first one's outcomes exactly; run first, the case with eps 0.3 is right,
    after the case with eps 0.1 it is wrong. Before, no state was named and the diagnosis went looking for a line."""
    ex = exercises.get("loss")
    path = _with_first_lines(ex, tmp_path, "    if not _SMOOTHING:\n        _SMOOTHING.append(eps)\n"
                             "    eps = _SMOOTHING[0]\n", above="_SMOOTHING = []")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert "case 2 is right as the first call of your backward and wrong after 1 call" in result.keeps_state
    assert f"_SMOOTHING ({path.name}:{_line(path, '_SMOOTHING = []')}), a module-level name" in result.keeps_state


def test_a_value_kept_on_the_function_is_named(tmp_path):
    """The dropout probability kept as an attribute of the function on its first call."""
    ex = exercises.get("dropout")
    name = ex.target.__name__
    path = _with_first_lines(ex, tmp_path, f"    if not hasattr({name}, 'scale'):\n"
                             f"        {name}.scale = mask.max()\n    mask = (mask != 0) * {name}.scale\n")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert f"{name}.scale, an attribute" in result.keeps_state


def test_the_lines_taking_the_kept_value_are_the_location(tmp_path):
    """The smoothing eps cached at module level: the mistake is where the kept value is taken (``eps = _SMOOTHING[0]``),
    not the test or the assignment that fill the cache (harmless once nothing reads it); no first wrong step is
    searched by replaying one pass of a function that changes at every call."""
    ex = exercises.get("loss")
    path = _with_first_lines(ex, tmp_path, "    if not _SMOOTHING:\n        _SMOOTHING.append(eps)\n"
                             "    eps = _SMOOTHING[0]\n", above="_SMOOTHING = []")
    result = _graded(ex, path)
    taken = _line(path, "eps = _SMOOTHING[0]")
    assert result.kept_lines == (taken,), result.kept_lines
    assert f"the mistake is on your line {taken}, which takes its value" in result.keeps_state
    assert result.steps == []


def test_code_raising_only_in_the_finite_differences_is_graded_not_a_crash(tmp_path):
    """A linear backward caching W^T from its first call: the graded cases run (wrong), the finite differences' new
    layers of another shape make it raise. That was an internal error of the grader; now it is said as a hint and
    the grade stands (keeps state, its line named)."""
    ex = exercises.get("linear")
    path = _with_first_lines(ex, tmp_path, "    if not _CACHE:\n        _CACHE.append(w.T.copy())\n"
                             "    dx_cached = dy @ _CACHE[0]\n", above="_CACHE = []")
    from grad_checks import lab
    result, status, message = lab.check_file(str(path))
    assert status == 1 and result is not None, message
    assert result.keeps_state is not None, str(result)
    assert any("finite differences: your code raised ValueError" in h for h in result.hints), str(result)


# -- issue 67, held-out set 2's misses: state in a helper, a scale kept where every case had one d_k, a flag read in
# a conditional expression

def test_a_default_argument_of_a_helper_in_the_file_is_named_with_the_line_reading_it(tmp_path):
    """The embedding's scale kept in a helper's mutable default: the answer's own defaults and the module's names held
    no state, so none was named and the scaled gradients were blamed on the scatter."""
    ex = exercises.get("embedding")
    path = _with_first_lines(ex, tmp_path, "    dy = _times(dy, scale) / scale\n",
                             above="def _times(dy, scale, seen={}):\n    kept = seen.setdefault('s', scale)\n"
                                   "    return dy * kept")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert f"a default argument of _times ({path.name}:{_line(path, 'def _times(')})" in result.keeps_state
    assert result.kept_lines == (_line(path, "kept = seen.setdefault"),), result.kept_lines


def test_a_scale_kept_from_the_first_call_shows_in_a_case_of_another_d_k(tmp_path):
    """1/sqrt(d_k) kept at module level: every attention case had d_k 4, so the kept scale was right in every order
    and the answer graded EXACT; the last case now has d_k 8."""
    ex = exercises.get("attention")
    path = _with_first_lines(ex, tmp_path, "    scale = _KEPT.setdefault('scale', scale)\n", above="_KEPT = {}")
    result = _graded(ex, path)
    assert not result.exact and result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "scale = _KEPT.setdefault"),), result.kept_lines


def test_a_kept_flag_read_in_a_conditional_expression_is_the_location(tmp_path):
    """A test choosing what is computed (``0.3 if _FIRST[0] else 0.1``) reads the kept place: its line is the
    mistake's; the ``if`` that only fills the place is not. Before, every test was set aside and, no read left, the
    fill and the append were named with it."""
    ex = exercises.get("loss")
    path = _with_first_lines(ex, tmp_path, "    if not _FIRST:\n        _FIRST.append(eps > 0.2)\n"
                             "    eps = 0.3 if _FIRST[0] else 0.1\n", above="_FIRST = []")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "eps = 0.3 if _FIRST[0]"),), result.kept_lines


def test_a_value_kept_in_a_closure_is_named_with_the_line_reading_it(tmp_path):
    """The smoothing eps kept in a dict of the function that made the backward (a closure's cell): no module-level
    name, default or attribute changed, so the fresh order put nothing back and no state was named."""
    ex = exercises.get("loss")
    path = lab_files.write(ex, ex.target, tmp_path)
    text = path.read_text()
    name = ex.target.__name__
    start, end = text.index(f"def {name}("), text.index("# numformer's LabelSmoothedCrossEntropy, its")
    text = text[:start] + f'''def _make():
    seen = {{}}

    def backward(p, y, eps, weight):
        kept = seen.setdefault("eps", eps)
        dz = p - kept / p.shape[1]
        dz[np.arange(p.shape[0]), y] -= 1.0 - kept
        return dz * weight[:, None]
    return backward


{name} = _make()


''' + text[end:]
    if "import numpy as np" not in text:
        text = "import numpy as np\n" + text
    path.write_text(text)
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert f"backward.seen ({path.name}:{_line(path, 'seen = {}')}), a variable of its closure" in result.keeps_state
    assert result.kept_lines == (_line(path, 'kept = seen.setdefault("eps", eps)'),), result.kept_lines


def test_a_default_filled_under_a_guard_is_located_at_its_read(tmp_path):
    """``if not seen: seen.append(scale)`` fills a default; the guard and the fill take nothing from it: the line
    reading ``seen[0]`` is the mistake's (before: all three named)."""
    ex = exercises.get("embedding")
    path = _with_first_lines(ex, tmp_path, "    if not seen:\n        seen.append(scale)\n    scale = seen[0]\n",
                             args=", seen=[]")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "scale = seen[0]"),), result.kept_lines


def test_a_module_value_read_in_a_helper_is_located_in_the_helper(tmp_path):
    """1/d kept at module level and read by a helper the backward calls: the helper's line (before: none named)."""
    ex = exercises.get("layernorm")
    helper = ("_KEEP = []\n\n\ndef _feature_mean(a):\n    if not _KEEP:\n        _KEEP.append(1.0 / a.shape[-1])\n"
              "    return a.sum(axis=-1, keepdims=True) * _KEEP[0]")
    path = _with_first_lines(ex, tmp_path, "    _feature_mean(dy)\n", above=helper)
    text = path.read_text().replace(".mean(axis=-1, keepdims=True)", "__M__")
    text = text.replace("    _feature_mean(dy)\n", "")
    body = text[text.index("def layernorm_backward("):]
    text = text[:text.index("def layernorm_backward(")] + body.replace(
        "(dxhat * xhat)__M__", "_feature_mean(dxhat * xhat)").replace("dxhat__M__", "_feature_mean(dxhat)")
    path.write_text(text.replace("__M__", ".mean(axis=-1, keepdims=True)"))
    assert "_feature_mean(dxhat * xhat)" in path.read_text()
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "return a.sum(axis=-1, keepdims=True) * _KEEP[0]"),), result.kept_lines


def test_a_function_made_on_the_first_call_is_kept_state(tmp_path):
    """A module-level name bound on the first call to a function made there (``def _shift`` under ``if _shift is
    None``), closing over that call's eps: the file's own functions are its code, but this one is a value kept
    (before: every callable was left out, so nothing was named and the later calls raised or went wrong unexplained)."""
    ex = exercises.get("loss")
    path = _with_first_lines(ex, tmp_path, "    global _shift\n    if _shift is None:\n        first = eps\n\n"
                             "        def _shift(q):\n            return q - first / q.shape[1]\n"
                             "    p = _shift(p) + eps / p.shape[1]\n", above="_shift = None")
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert f"_shift ({path.name}:{_line(path, '_shift = None')}), a module-level name" in result.keeps_state
    assert result.kept_lines == (_line(path, "p = _shift(p) + eps / p.shape[1]"),), result.kept_lines


def test_an_attribute_of_a_helper_is_kept_state(tmp_path):
    """1/(1-p) kept as an attribute of a helper the backward calls (held-out set 5: the caller's line was blamed,
    only the answer's own attributes were places)."""
    ex = exercises.get("dropout")
    helper = ("def _scale_of(mask):\n    if not hasattr(_scale_of, 'kept'):\n        _scale_of.kept = float(mask.max())\n"
              "    return _scale_of.kept")
    path = _with_first_lines(ex, tmp_path, "    mask = (mask != 0) * _scale_of(mask)\n", above=helper)
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert "_scale_of.kept, an attribute" in result.keeps_state
    assert result.kept_lines == (_line(path, "    return _scale_of.kept"),), result.kept_lines


def test_a_closure_made_by_a_factory_is_named_at_the_answers_call(tmp_path):
    """The keep scale read off the first mask into the cell of a closure a factory made (``_scale_of =
    _make_scale()``): the closure's own read is no line a student edits in the backward; the backward's call of it
    is named (before: the closure's ``return seen["s"]``)."""
    ex = exercises.get("dropout")
    factory = ("def _make_scale():\n    seen = {}\n\n    def scale_of(mask):\n        if 's' not in seen:\n"
               "            seen['s'] = mask.max()\n        return seen['s']\n    return scale_of\n\n\n"
               "_scale_of = _make_scale()")
    path = _with_first_lines(ex, tmp_path, "    return dy * (mask != 0) * _scale_of(mask)\n", above=factory)
    result = _graded(ex, path)
    assert result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "return dy * (mask != 0) * _scale_of(mask)"),), result.kept_lines


def _multihead_keeping_its_head_count(ex, tmp_path):
    path = lab_files.write(ex, ex.target, tmp_path)
    text = path.read_text()
    body = ("        if MultiHeadAttention._kept_heads is None:\n"
            "            MultiHeadAttention._kept_heads = self.heads\n"
            "        h = MultiHeadAttention._kept_heads\n"
            "        g = self.w_o.backward(dy)\n"
            "        b, t, hd = g.shape\n"
            "        g = g.reshape(b, t, h, hd // h).transpose(0, 2, 1, 3)\n"
            "        dq, dk, dv = self.attention.backward(g)\n"
            "        dx = self.w_q.backward(self._merge(dq))\n"
            "        dkv = self.w_k.backward(self._merge(dk)) + self.w_v.backward(self._merge(dv))\n"
            "        return (dx, dkv) if self._cross else dx + dkv\n")
    start = text.index("    def backward(self, dy):")
    head = text[start:].split(":\n", 1)[0] + ":\n"
    text = text[:start] + "    _kept_heads = None\n\n" + head + body
    path.write_text(text)
    return path


def test_a_head_count_kept_on_the_class_shows_with_another_number_of_heads(tmp_path):
    """The number of heads kept as a class attribute on the first call: every case had 4 heads, so it graded EXACT;
    the encoder-decoder case has 2 and the kept count is named at the line reading it."""
    ex = exercises.get("multihead")
    path = _multihead_keeping_its_head_count(ex, tmp_path)
    result = _graded(ex, path)
    assert not result.exact and result.keeps_state is not None, str(result)
    assert result.kept_lines == (_line(path, "h = MultiHeadAttention._kept_heads"),), result.kept_lines


def test_student_code_raising_inside_a_child_of_numformers_in_the_differences_is_theirs(tmp_path):
    """The finite differences run the cases again on new layers, after more calls: the kept head count makes the
    attention child (numformer's) raise on the student's arrays. That error is the student's code's, said as a hint;
    it was reported as an internal error of numformer's (its innermost frame is numformer's)."""
    ex = exercises.get("multihead")
    path = _multihead_keeping_its_head_count(ex, tmp_path)
    result, status, message = lab.check_file(str(path))
    assert status == 1 and result is not None, message
    assert any("finite differences: your code raised ValueError" in h for h in result.hints), str(result)


def test_a_flag_kept_from_the_first_call_shows_when_the_last_case_runs_first(tmp_path):
    """The bias flag kept as an attribute of the function on the first call: the no-bias case runs last, so the
    reverse pass (state as the first pass left it) and each case alone repeat the first pass; the reverse pass from
    the state before the first one shows it (before: EXACT, and the finite differences' None for db, which the
    output guard refuses, an internal error)."""
    ex = exercises.get("linear")
    path = _with_first_lines(ex, tmp_path, "    if getattr(linear_backward, 'has_bias', None) is None:\n"
                             "        linear_backward.has_bias = with_bias\n"
                             "    with_bias = linear_backward.has_bias\n")
    result, status, message = lab.check_file(str(path))
    assert status == 1 and result is not None, message
    assert result.keeps_state is not None and "linear_backward.has_bias, an attribute" in result.keeps_state
    assert result.kept_lines == (_line(path, "with_bias = linear_backward.has_bias"),), result.kept_lines
