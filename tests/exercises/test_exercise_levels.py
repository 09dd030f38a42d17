"""The two levels of an exercise file: ``derive`` (the default) gives the forward, the shapes and what the
backward returns, and none of the backward's equations; ``implement`` gives the equations. And ``hint`` reveals
the derivation a step at a time."""
import ast
import inspect
import re
import textwrap

import pytest

from grad_checks import exercises, lab
from grad_checks.__main__ import main as grad_checks_main
from grad_checks.exercise import skeleton


def _squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def reference_expressions(ex) -> list:
    """The expressions numformer's backward computes: every operation, call and returned value of the
    reference's body (docstring left out), as code, of 8 characters or more."""
    fdef = ast.parse(textwrap.dedent(inspect.getsource(ex.target))).body[0]
    body = fdef.body[1:] if isinstance(fdef.body[0], ast.Expr) and isinstance(fdef.body[0].value, ast.Constant) \
        else fdef.body
    found = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, (ast.BinOp, ast.Call, ast.UnaryOp, ast.Subscript)):
                code = _squeezed(ast.unparse(node))
                if len(code) >= 8:
                    found.add(code)
    return sorted(found)


GRADIENT_EQUATION = re.compile(r"\b(d[A-Za-z_]\w*|grad\w*)\s*(\[[^\]]*\])?\s*(\+=|=)")
# forward mode's answer is its tangents (``r_dot = ...``, ``dx_dot = ...``); the backward it differentiates is given
TANGENT_EQUATION = re.compile(r"\b(\w+_dot)\s*(\[[^\]]*\])?\s*(\+=|=)")


def reference_equations(ex) -> list:
    """The backward's equations as numformer's docstrings state them: every line of the reference's module
    docstring and of its own docstring that assigns a gradient (``dx = ...``, ``dW = ...``, ``grad += ...``); for a
    forward-mode exercise, a tangent (``xhat_dot = ...``)."""
    assigns = GRADIENT_EQUATION if ex.mode == "backward" else TANGENT_EQUATION
    docs = (inspect.getdoc(inspect.getmodule(ex.target)) or "") + "\n" + (inspect.getdoc(ex.target) or "")
    out = []
    for line in docs.replace("``", "").splitlines():
        for piece in re.split(r"[;:]\s|,\s(?=d[A-Za-z_]\w*\s*=)", line):
            piece = re.split(r"\s\((?=[a-z]+ [a-z]+)|,\s(?=with|over|the|or)", piece)[0]  # a comment after it
            m = assigns.search(piece)
            equation = _squeezed(piece[m.start():]).rstrip(".,") if m else ""
            if len(equation) >= 6:
                out.append(equation[:24])  # the equation's first 24 characters: distinctive, whatever follows
    return out


@pytest.mark.parametrize("name", exercises.ORDER)
def test_the_derive_level_has_the_forward_and_no_backward_equation(name):
    ex = exercises.get(name)
    text = skeleton(ex, 1, 1, "my.py", "derive")
    compile(text, "my.py", "exec")
    assert ex.forward and ex.returns and len(ex.steps) >= 2, "the exercise needs forward, returns and steps"
    assert _squeezed(textwrap.dedent(ex.forward).split("\n\n")[0][:40]) in _squeezed(text)
    assert "python -m grad_checks hint my.py" in text and "Level: derive" in text
    squeezed = _squeezed(text)
    # what the forward computes too (offset + t: the rows it reads) is the forward's, shown as such
    forward = _squeezed("".join(inspect.getsource(f) for f in list(ex.show) + [ex.layer.forward]))
    leaked = [e for e in reference_expressions(ex) if e in squeezed and e not in forward]
    assert not leaked, f"the derive-level file holds the reference's code: {leaked}"
    leaked = [e for e in reference_equations(ex) if e in squeezed]
    assert not leaked, f"the derive-level file states the backward: {leaked}"


@pytest.mark.parametrize("name", exercises.ORDER)
def test_the_implement_level_states_the_equations(name):
    ex = exercises.get(name)
    text = skeleton(ex, 1, 1, "my.py", "implement")
    compile(text, "my.py", "exec")
    assert inspect.getdoc(inspect.getmodule(ex.target)).splitlines()[0] in text and "Level: implement" in text
    # the search above finds what it looks for: the implement level states the backward
    assert any(e in _squeezed(text) for e in reference_equations(ex) + reference_expressions(ex)) \
        or not reference_equations(ex)


def test_the_leak_search_finds_a_planted_equation():
    ex = exercises.get("layernorm")
    planted = type(ex)(**{f: getattr(ex, f) for f in ex.__dataclass_fields__ if f != "mistake_names"})
    planted.forward = ex.forward + "\n\n    dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))"
    text = _squeezed(skeleton(planted, 1, 1, "my.py", "derive"))
    assert any(e in text for e in reference_equations(ex))
    planted.forward = ex.forward + "\n\n    dxhat = dy * gamma; (dy * xhat).sum(axis=0)"
    text = _squeezed(skeleton(planted, 1, 1, "my.py", "derive"))
    assert any(e in text for e in reference_expressions(ex))


def test_exercise_writes_the_derive_level_unless_asked_for_implement(tmp_path, capsys):
    assert grad_checks_main(["exercise", "layernorm", "--out", str(tmp_path)]) == 0
    assert "Level: derive" in (tmp_path / "my_layernorm.py").read_text()
    assert "hint" in capsys.readouterr().out
    assert grad_checks_main(["exercise", "layernorm", "--out", str(tmp_path / "i"), "--level", "implement"]) == 0
    text = (tmp_path / "i" / "my_layernorm.py").read_text()
    assert "Level: implement" in text and "dx = r * (dxhat - mean(dxhat)" in text


def test_hint_reveals_one_more_step_each_time(tmp_path, capsys):
    ex = exercises.get("layernorm")
    path = lab.write_exercise("layernorm", str(tmp_path))
    seen = []
    for k in range(1, len(ex.steps) + 2):  # one call past the last: the whole derivation again
        assert grad_checks_main(["hint", str(path)]) == 0
        out = capsys.readouterr().out
        shown = min(k, len(ex.steps))
        assert f"step {shown} of {len(ex.steps)}" in out
        assert all(_squeezed(s)[:60] in _squeezed(out) for s in ex.steps[:shown])  # the steps so far, repeated
        assert not any(_squeezed(s)[:60] in _squeezed(out) for s in ex.steps[shown:])  # none ahead
        seen.append(out)
    assert "that is the whole derivation" in seen[-1] and "run it again for step 2" in seen[0]
    assert grad_checks_main(["hint", str(path), "--step", "2"]) == 0
    assert "step 2 of" in capsys.readouterr().out
    assert grad_checks_main(["hint", str(path), "--all"]) == 0
    assert _squeezed(ex.steps[-1])[:60] in _squeezed(capsys.readouterr().out)


def test_hint_reads_a_file_that_does_not_run_yet(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text('EXERCISE = "softmax"\ndef softmax_backward(dy, y:\n')  # a syntax error: hints still come
    assert grad_checks_main(["hint", str(path)]) == 0
    assert "step 1 of" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["hint", "{dir}/nope.py"], "no such file"),
    (["hint", "{dir}/my_layernorm.py", "--step", "99"], "has steps 1 to"),
    (["hint", "{dir}/other.py"], "does not say which exercise"),
    (["exercise", "layernorm", "--level", "guess"], "invalid choice"),
    (["exercise", "--status", "{dir}/nowhere"], "no such folder"),
])
def test_hint_and_level_mistakes_are_one_line_exit_2(args, needle, tmp_path, capsys):
    lab.write_exercise("layernorm", str(tmp_path))
    (tmp_path / "other.py").write_text("x = 1\n")
    try:
        status = grad_checks_main([a.format(dir=tmp_path) for a in args])
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    out, err = capsys.readouterr()
    assert status == 2 and len(err.strip().splitlines()) == 1 and needle in err, (status, err)
