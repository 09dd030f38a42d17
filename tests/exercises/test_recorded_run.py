"""The recording behind the first wrong step (grad_checks/recorded_run.py, grad_checks/first_wrong_step.py): a
rewritten function computes exactly what it computed before, and records every array along the way with its
code, its file's line and its operands; a replayed value changes what follows; a factor is named by what it
equals in every case, never by one case's number alone."""
import inspect

import numpy as np
import pytest

import student_mistakes
import student_mistakes_layers
from grad_checks import exercises
from grad_checks.factor_names import name_factor
from grad_checks.first_wrong_step import first_wrong_steps
from grad_checks.recorded_run import Recorder, recorded
from numformer.layers.layernorm import layernorm_backward
from numformer.loss import smoothed_cross_entropy_backward


def _ln_args(rng, n=4, d=5):
    return rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.random((n, 1)) + 0.5, rng.standard_normal(d)


def test_a_recorded_function_returns_what_it_returned_before():
    rng = np.random.default_rng(0)
    args = _ln_args(rng)
    recorder = Recorder()
    got = recorded(layernorm_backward, recorder)(*args)
    for a, b in zip(got, layernorm_backward(*args)):
        assert np.array_equal(a, b)
    assert len(recorder.calls) == 1


def test_every_intermediate_is_recorded_with_its_code_line_and_operands():
    rng = np.random.default_rng(1)
    recorder = Recorder()
    recorded(layernorm_backward, recorder)(*_ln_args(rng))
    records = {r.code: r for r in recorder.calls[0].records}
    first = inspect.getsourcelines(layernorm_backward)[1]
    lines = inspect.getsourcelines(layernorm_backward)[0]
    dxhat = records["dy * gamma"]
    assert dxhat.variable == "dxhat" and "dxhat = dy * gamma" in lines[dxhat.line - first]
    mean = records["dxhat.mean(axis=-1, keepdims=True)"]
    assert mean.operands == (dxhat.index,) and mean.value.shape == (4, 1)
    assert {records[c].returned for c in ("dx", "dgamma", "dbeta")} == {0, 1, 2}
    given = [r.code for r in recorder.calls[0].records if r.given]
    assert given == ["dy", "xhat", "r", "gamma"]


def test_an_array_changed_in_place_is_recorded_again():
    p = np.full((3, 4), 0.25)
    recorder = Recorder()
    recorded(smoothed_cross_entropy_backward, recorder)(p, np.array([0, 1, 2]), 0.1, np.array([1.0, 1.0, 0.0]))
    dz = [r for r in recorder.calls[0].records if r.variable == "dz"]
    assert len(dz) == 2 and dz[1].code.startswith("dz[") and dz[1].operands[0] == dz[0].index
    assert not np.array_equal(dz[0].value, dz[1].value)


def test_a_replayed_value_changes_what_follows():
    rng = np.random.default_rng(2)
    args = _ln_args(rng)
    plain = Recorder()
    recorded(layernorm_backward, plain)(*args)
    mean = next(r for r in plain.calls[0].records if r.code == "dxhat.mean(axis=-1, keepdims=True)")
    replay = Recorder({(0, mean.key): 5 * mean.value})
    dx, dgamma, _ = recorded(layernorm_backward, replay)(*args)
    dxhat = args[0] * args[3]
    expected = args[2] * (dxhat - 5 * dxhat.mean(-1, keepdims=True)
                          - args[1] * (dxhat * args[1]).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, expected, rtol=1e-12)
    assert np.array_equal(dgamma, layernorm_backward(*args)[1])  # not downstream of it: unchanged


def test_a_method_with_super_and_a_closure_is_recorded():
    class Base:
        def backward(self, dy):
            return dy * 2.0

    k = 3.0

    class Child(Base):
        def backward(self, dy):
            doubled = super().backward(dy)
            return doubled * k

    recorder = Recorder()
    fn = recorded(Child.backward, recorder)
    out = fn(Child(), np.ones((2, 2)))
    assert np.array_equal(out, np.full((2, 2), 6.0))
    # (the dy handed to a backward is recorded at that use: the value that call is given)
    assert [(r.variable, r.kind) for r in recorder.calls[0].records if not r.given] == [
        (None, "name"), ("doubled", "backward"), (None, "Mult")]


def test_code_without_source_is_not_recorded():
    assert recorded(np.add, Recorder()) is None
    assert recorded(eval("lambda x: x"), Recorder()) is None


class _Args:
    def __init__(self, **kw):
        self.args = kw


def test_a_factor_is_named_by_what_it_equals_in_every_case():
    ln = exercises.get("layernorm")
    calls = [_Args(dy=np.zeros((n, d))) for n, d in [(18, 8), (2, 16), (5, 3)]]
    assert name_factor(ln, [8.0, 16.0, 3.0], calls) == "d"
    assert name_factor(ln, [1 / 18, 1 / 2, 1 / 5], calls) == "1/n"
    assert name_factor(ln, [2.0, 2.0, 2.0], calls) == "2"
    assert name_factor(ln, [-1.0, -1.0, -1.0], calls) == "-1"
    # d in the first case, but not in the others: no name rather than one case's coincidence
    assert name_factor(ln, [8.0, 8.0, 8.0], calls) is None
    at = exercises.get("attention")
    calls = [_Args(q=np.zeros((3, 4, 5, dk)), k=np.zeros((3, 4, 6, dk)), scale=1 / np.sqrt(dk)) for dk in (4, 9)]
    assert name_factor(at, [2.0, 3.0], calls) == "sqrt(d_k)"


# two of the students' mistakes of the set (tests/exercises/student_mistakes*.py), run here on the engine itself
_sums_where_means = student_mistakes.layernorm_sums_where_means_belong  # the 1/d forgotten in both means
_mask_reversed = student_mistakes_layers.attention_mask_polarity_reversed  # np.where(masked, ds, 0)


def _right(dy, xhat, r, gamma):
    dxhat = dy * gamma
    return r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)), \
        (dy * xhat).sum(axis=0), dy.sum(axis=0)


def test_two_mistakes_are_two_first_steps_and_a_right_answer_has_none():
    ln = exercises.get("layernorm")
    steps = first_wrong_steps(ln, _sums_where_means)
    assert [(s.name, s.factor) for s in steps] == [("mean(dxhat)", "d"), ("mean(dxhat * xhat)", "d")]
    first = inspect.getsourcelines(_sums_where_means)[1]
    assert [s.line - first for s in steps] == [2, 3]
    assert first_wrong_steps(ln, _right) == []


def test_a_reversed_mask_is_said_in_the_exercises_terms():
    steps = first_wrong_steps(exercises.get("attention"), _mask_reversed)
    assert steps[0].pattern == "mask reversed" and steps[0].variable == "ds"
    assert steps[0].code == "xp.where(masked, xp.asarray(0, dtype=ds.dtype), ds)"


@pytest.mark.parametrize("planted", ["no replay", "no factor names"])
def test_the_planted_shortcuts_lose_a_diagnosis(planted, monkeypatch):
    import grad_checks.first_wrong_step as fws
    if planted == "no replay":  # without the replay of two fixes together, two mistakes are no first steps
        monkeypatch.setattr(fws, "_two", lambda engine, keys: [])
        steps = first_wrong_steps(exercises.get("layernorm"), _sums_where_means)
        assert [s.name for s in steps] != ["mean(dxhat)", "mean(dxhat * xhat)"]
    else:
        import grad_checks.factor_names as factor_names
        monkeypatch.setattr(factor_names, "expressions", lambda symbols: [])
        steps = first_wrong_steps(exercises.get("layernorm"), _sums_where_means)
        assert steps[0].factor != "d"
