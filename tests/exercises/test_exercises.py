"""The exercises (python -m grad_checks exercise / check): for every exercise the reference solution checks
exact, every catalogued mistake planted in a file is diagnosed by its name (and is wrong by finite differences
too, an oracle that does not trust numformer's backward), the unsolved file says "not implemented" in one line;
student errors (shapes, NaN, exceptions, syntax) are one line each; the command line's own errors exit 2."""
import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

import lab_files
from numformer.activations import ACTIVATIONS
from grad_checks import exercises, lab
from grad_checks.__main__ import main as grad_checks_main
from grad_checks.exercise import Exercise, skeleton
from grad_checks.grading import grade


@pytest.mark.parametrize("name", exercises.ORDER)
def test_reference_checks_exact_and_every_mistake_is_named(name, tmp_path):
    ex = exercises.get(name)
    result, status, message = lab.check_file(str(lab_files.write(ex, ex.target, tmp_path)))
    assert status == 0 and message == "", message
    assert result.exact, str(result)
    assert len(result.cases) >= 2 and all(t.fd is not None and t.fd.passed for t in result.tensors)
    assert result.mistake is None and "EXACT" in str(result)
    for mistake in ex.mistakes:
        result, status, message = lab.check_file(str(lab_files.write(ex, mistake, tmp_path)))
        assert status == 1, (mistake.__name__, message)
        assert result.mistake == mistake.__name__, (mistake.__name__, str(result))
        assert Exercise.explanation(mistake) in str(result)
        # wrong by finite differences as well, or failing outright: the catalogue holds real mistakes
        assert result.errors or any(not t.fd.passed for t in result.tensors), mistake.__name__


@pytest.mark.parametrize("name", exercises.ORDER)
def test_the_unsolved_file_says_not_implemented_in_one_line(name, tmp_path, capsys):
    path = lab.write_exercise(name, str(tmp_path))
    assert path.name == f"my_{name}.py"
    status = grad_checks_main(["check", str(path)])
    out, err = capsys.readouterr()
    assert status == 1 and err == ""
    assert len(out.strip().splitlines()) == 1, out
    assert "is not implemented yet (NotImplementedError at" in out and f"{path.name}:" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("name", exercises.ORDER)
def test_the_implement_level_holds_the_equations_not_the_answer(name):
    ex = exercises.get(name)
    text = skeleton(ex, 1, 1, "my.py", "implement")
    compile(text, "my.py", "exec")
    source = textwrap.dedent(inspect.getsource(ex.target))
    body = source.split('"""')[-1] if '"""' in source else source.split(":", 1)[1]
    answer = [line.strip() for line in body.splitlines() if len(line.strip()) > 12]
    after_header = text[text.index('\n"""\n') + 5:]  # the header quotes the equations: that is intended
    code = [line for line in after_header.splitlines() if not line.lstrip().startswith("#")]
    leaked = [line for line in answer if any(line in c for c in code)]
    assert not leaked, leaked
    assert "raise NotImplementedError" in text and f'EXERCISE = "{name}"' in text
    assert inspect.getdoc(inspect.getmodule(ex.target)).splitlines()[0] in text  # the equations
    assert f"python -m grad_checks check my.py" in text


def test_list_is_in_the_order_to_learn_them(capsys):
    assert grad_checks_main(["exercise", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out] == list(exercises.ORDER)
    # one per exercise file of grad_checks/exercises/ and one per activation of the table, each once: counted
    # from the folder and the table, not by hand
    folder = Path(exercises.__file__).parent
    files = {p.stem for p in folder.glob("*.py") if "EXERCISE = Exercise(" in p.read_text()}
    assert len(exercises.ORDER) == len(set(exercises.ORDER)) == len(files | set(ACTIVATIONS))
    assert set(exercises.ORDER) == files | set(ACTIVATIONS)


def test_each_exercise_says_its_place_and_the_order_follows():
    """The order comes from each exercise's stage and rank: a stage out of STAGES is refused, and the numbering
    is the stages' order."""
    places = [(exercises.STAGES.index(exercises.get(n).stage), n) for n in exercises.ORDER]
    assert [p for p, _ in places] == sorted(p for p, _ in places)
    backward = [n for n in exercises.ORDER if exercises.get(n).mode == "backward"]
    assert exercises.ORDER[0] == next(iter(ACTIVATIONS)) and backward[-1] == "decoder_layer"
    assert exercises.get(exercises.ORDER[-1]).stage == "forward mode"  # forward mode last, once reverse mode is known
    ex = exercises.get("relu")
    original = ex.stage
    try:
        ex.stage = "somewhere"
        with pytest.raises(ValueError, match="give it one of elementwise, matrix"):
            exercises._place("relu")
    finally:
        ex.stage = original


def test_exercise_names_accept_the_layer_class_name(tmp_path):
    assert exercises.get("LayerNorm").name == "layernorm"
    assert exercises.get("ScaledDotProductAttention").name == "attention"
    assert exercises.get("DecoderLayer").name == "decoder_layer"
    with pytest.raises(exercises.UnknownExercise):
        exercises.get("conv2d")


def _one_line_error(status, out, err, needle, code=2):
    assert status == code, (status, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0] and needle in lines[0], err
    assert "Traceback" not in out + err


def test_command_line_mistakes_are_one_line_exit_2(tmp_path, capsys):
    path = lab.write_exercise("relu", str(tmp_path))
    before = path.read_text()
    _one_line_error(grad_checks_main(["exercise", "relu", "--out", str(tmp_path)]), *capsys.readouterr(),
                    "may hold your work")
    assert path.read_text() == before  # nothing saved is lost
    _one_line_error(grad_checks_main(["check", str(tmp_path / "nope.py")]), *capsys.readouterr(), "no such file")
    _one_line_error(grad_checks_main(["exercise", "conv2d"]), *capsys.readouterr(), "unknown exercise 'conv2d'")
    bare = tmp_path / "bare.py"
    bare.write_text("def relu_backward(dy, positive):\n    return dy * positive\n")
    _one_line_error(grad_checks_main(["check", str(bare)]), *capsys.readouterr(), "--exercise NAME")
    assert grad_checks_main(["check", "--exercise", "relu", str(bare)]) == 0  # a file of one's own, named
    assert "EXACT" in capsys.readouterr().out


@pytest.mark.parametrize("body, needle", [
    ("    return dy.T, (dy * xhat).sum(axis=0), dy.sum(axis=0)",
     "dx (returned by layernorm_backward) has shape (8, 18), expected (18, 8) (transposed?)"),
    ("    return dy, (dy * xhat).sum(axis=1), dy.sum(axis=0)",
     "dgamma (returned by layernorm_backward) has shape (18,), expected (8,) (summed over the wrong axis?)"),
    ("    return dy * np.nan, (dy * xhat).sum(axis=0), dy.sum(axis=0)", "holds NaN or inf at (0, 0) (144 of 144"),
    ("    return dy, dy", "layernorm_backward returned a tuple of 2; it returns 3: (dx, dgamma, dbeta)"),
    ("    return dy @ xhat", "raised ValueError at my_layernorm.py:"),
    ("    return undefined_name", "raised NameError at my_layernorm.py:"),
    ("    dy *= gamma\n    return dy, (dy * xhat).sum(axis=0), dy.sum(axis=0)",
     "layernorm_backward changed its argument dy in place"),
])
def test_student_errors_are_one_clear_line(body, needle, tmp_path):
    text = lab.skeleton(exercises.get("layernorm"), 5, 12, "my_layernorm.py")
    stub = next(line for line in text.splitlines() if line.strip().startswith("raise NotImplementedError("))
    path = tmp_path / "my_layernorm.py"
    path.write_text(text.replace(stub, body))
    result, status, _ = lab.check_file(str(path))
    assert status == 1 and not result.passed
    report = str(result)
    assert needle in report, report
    assert "Traceback" not in report and report.count("\n  ERROR: ") == len(result.cases)  # one line per case


def test_a_syntax_error_is_one_line(tmp_path, capsys):
    path = tmp_path / "my_relu.py"
    path.write_text('EXERCISE = "relu"\ndef relu_backward(dy, positive)\n    return dy\n')
    _one_line_error(grad_checks_main(["check", str(path)]), *capsys.readouterr(), "my_relu.py:2", code=1)


def _grade_layernorm(fn):
    return grade(exercises.get("layernorm"), fn)


def test_a_wrong_answer_outside_the_catalogue_gets_a_hint():
    def doubled(dy, xhat, r, gamma):
        dxhat = dy * gamma
        dx = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        return 2 * dx, (dy * xhat).sum(0), dy.sum(0)

    def flipped(dy, xhat, r, gamma):
        dx, dg, db = doubled(dy, xhat, r, gamma)
        return -dx / 2, dg, db

    result = _grade_layernorm(doubled)
    assert not result.passed and result.mistake is None
    assert "input:x is numformer's times 2" in str(result)
    assert "WRONG" in str(result) and " at (" in str(result)  # the worst entry's index
    assert "with the sign flipped" in str(_grade_layernorm(flipped))


def test_float32_arithmetic_is_wrong_with_a_hint_and_a_small_error_is_approximate():
    def float32(dy, xhat, r, gamma):  # numformer's formula written out (calling it would be NOT YOURS), in float32
        dy, xhat, r, gamma = (a.astype(np.float32) for a in (dy, xhat, r, gamma))
        dxhat = dy * gamma
        dx = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        return tuple(o.astype(np.float64) for o in (dx, (dy * xhat).sum(0), dy.sum(0)))

    result = _grade_layernorm(float32)
    assert not result.passed and "computed in float32" in str(result)

    def nearly(dy, xhat, r, gamma):  # right to 1e-8 relative: within the tolerance, not to round-off
        dxhat = dy * gamma
        dx = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        return tuple(o * (1 + 1e-8) for o in (dx, (dy * xhat).sum(0), dy.sum(0)))

    result = _grade_layernorm(nearly)
    assert result.passed and not result.exact
    assert {t.verdict for t in result.tensors} == {"approximate"}
    assert result.summary().startswith("APPROXIMATE")


def test_a_different_but_correct_formula_is_exact():
    def summed(dy, xhat, r, gamma):  # the same derivative, written with sums and 1/d
        d = dy.shape[-1]
        g = dy * gamma
        dx = r / d * (d * g - g.sum(-1, keepdims=True) - xhat * (g * xhat).sum(-1, keepdims=True))
        return dx, np.einsum("nd,nd->d", dy, xhat), dy.sum(0)

    assert _grade_layernorm(summed).exact


def test_the_plain_invocation_is_unchanged(capsys):
    assert grad_checks_main(["--layer", "ReLU"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("layer") and "4 tensors checked" in out  # the backward's, and 3 rows of forward mode


def test_a_composition_is_graded_as_the_class_written_helpers_and_all(tmp_path):
    path = tmp_path / "my_encoder_layer.py"
    path.write_text('EXERCISE = "encoder_layer"\n'
                    "from numformer.model import EncoderLayer as Base\n\n"
                    "class EncoderLayer(Base):\n"
                    "    def _through(self, residual, sublayer, dy):\n"
                    "        return residual.backward(dy, sublayer)\n\n"
                    "    def backward(self, dy):\n"
                    "        dy = self._through(self.ffn_residual, self.ffn, dy)\n"
                    "        return self._through(self.self_attn_residual, self.self_attn, dy)\n")
    result, status, _ = lab.check_file(str(path))
    assert status == 0 and result.exact, str(result)
