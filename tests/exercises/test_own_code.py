"""grad_checks/own_code.py: a student's backward that hands the work to numformer's own backward for the exercise
(calling the reference, its fast twin, the parent class's method, or assigning numformer's function) would grade
EXACT, being numformer's: the watch finds each such use with the line of the student's file, and the grade says NOT
YOURS. It must not find the right answer written out (numformer's reference copied into the file) for any exercise,
nor an answer that uses numformer's backward for another piece (attention calling softmax_backward, multi-head
attention calling its attention's backward), nor the grader's own calls of the reference (the output guard runs it
on a copy of the arguments on every call of a student's function: counted, it would call every answer numformer's)."""
import cProfile
import sys
from pathlib import Path

import numpy as np
import pytest

import lab_files
from grad_checks import exercises
from grad_checks.grading import grade
from grad_checks.own_code import (NotYours, OwnCall, calls_to_numformer, describe, numformer_backward_names,
                                  reexported, watch)
from numformer.finite_differences import run_case
from grad_checks.student_file import student_code
from numformer.kernels import kernel_mode
from numformer.user_code import load_file

LN = "numformer.layers.layernorm.layernorm_backward"
LN_FAST = "numformer.kernels.layernorm.layernorm_backward_fast"


# -- students' answers: each function's source becomes the body of the exercise file's function (or method) -------

def returns_numformers(dy, xhat, r, gamma):
    from numformer.layers.layernorm import layernorm_backward as numformers
    return numformers(dy, xhat, r, gamma)


def through_the_module(dy, xhat, r, gamma):
    import numformer.layers.layernorm as L
    return L.layernorm_backward(dy, xhat, r, gamma)


def calls_the_fast_twin(dy, xhat, r, gamma):
    from numformer.kernels.layernorm import layernorm_backward_fast
    return layernorm_backward_fast(dy, xhat, r, gamma)


def through_the_switch(dy, xhat, r, gamma):
    from numformer.kernels import kernel
    from numformer.layers import layernorm
    return kernel(layernorm.layernorm_backward)(dy, xhat, r, gamma)


def through_a_helper_beside_it(dy, xhat, r, gamma):
    import own_code_helper
    return own_code_helper.backward(dy, xhat, r, gamma)


def parents_backward(self, dy):
    return super().backward(dy)


def _answer(ex, fn, folder):
    """(the student's file holding ``fn`` as their answer, the answer loaded from it)."""
    path = lab_files.write(ex, fn, folder)
    return path, student_code(load_file(path), ex)


def _line(path, text) -> int:
    """The line of ``path`` that holds ``text`` (once)."""
    lines = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (text, lines)
    return lines[0]


def _graded(ex, answer, path):
    """(the grade, the uses of numformer's own backward seen) of ``answer`` graded as ``check`` grades it."""
    result = grade(ex, answer, file=path, finite_differences=False, diagnose=False)
    return result, result.own_uses


@pytest.mark.parametrize("fn, callee, text", [
    (returns_numformers, LN, "return numformers("),
    (through_the_module, LN, "return L.layernorm_backward("),
    (calls_the_fast_twin, LN_FAST, "return layernorm_backward_fast("),
    (through_the_switch, LN, "return kernel(layernorm.layernorm_backward)("),  # plain math under the grading
])
def test_a_layernorm_backward_that_calls_numformers_is_found_at_its_line(fn, callee, text, tmp_path):
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, fn, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert calls == [OwnCall(callee, str(path), _line(path, text))]
    assert not result.exact and result.not_yours == describe(calls)  # numformer's, so not the student's
    assert describe(calls) == f"calls numformer's own {callee} (my_layernorm.py:{_line(path, text)})"


def test_the_switch_to_the_fast_twin_is_looked_through(tmp_path):
    """With the kernels on, kernel(f) gives a function of numformer/kernels/__init__.py that calls the fast
    twin: the call is still the student's, made at their line."""
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, through_the_switch, tmp_path)
    rng = np.random.default_rng(0)
    dy, xhat, gamma, r = rng.normal(size=(6, 8)), rng.normal(size=(6, 8)), rng.normal(size=8), rng.random((6, 1))
    with kernel_mode("fast"):
        calls = calls_to_numformer(ex, lambda: answer(dy, xhat, r, gamma), path)
    assert calls == [OwnCall(LN_FAST, str(path), _line(path, "return kernel(layernorm.layernorm_backward)("))]


def test_a_helper_module_beside_the_file_calling_numformers_is_found(tmp_path):
    (tmp_path / "own_code_helper.py").write_text(
        "from numformer.layers.layernorm import layernorm_backward\n\n\n"
        "def backward(dy, xhat, r, gamma):\n    return layernorm_backward(dy, xhat, r, gamma)\n")
    ex = exercises.get("layernorm")
    sys.path.insert(0, str(tmp_path))  # as the student's folder is while the file imports (load_file)
    try:
        path, answer = _answer(ex, through_a_helper_beside_it, tmp_path)
        _, calls = _graded(ex, answer, path)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("own_code_helper", None)
    assert calls == [OwnCall(LN, str(tmp_path / "own_code_helper.py"), 5)]


def test_a_multihead_backward_calling_its_parents_is_found(tmp_path):
    ex = exercises.get("multihead")
    path, answer = _answer(ex, parents_backward, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert calls == [OwnCall("numformer.layers.attention.MultiHeadAttention.backward", str(path),
                             _line(path, "return super().backward(dy)"))]
    assert not result.exact and result.not_yours == describe(calls)


def test_numformers_function_assigned_as_the_answer_is_found(tmp_path):
    """``layernorm_backward = numformer's`` is called by numformer's layer, never from the student's file: the
    answer's code is numformer's, found without running it."""
    ex = exercises.get("layernorm")
    path = lab_files.write(ex, ex.target, tmp_path)
    path.write_text(path.read_text() + "\nfrom numformer.layers.layernorm import layernorm_backward  # noqa\n")
    answer = student_code(load_file(path), ex)
    result, calls = _graded(ex, answer, path)
    assert calls == [OwnCall(LN, str(path), None, "is")]
    assert not result.exact and result.not_yours == describe(calls)
    assert describe(calls) == f"is numformer's own {LN}, assigned instead of written"
    # a composition's method assigned in the class, and the function a --swap class (using(...)) calls
    mha = exercises.get("multihead")
    cls = type("MultiHeadAttention", (mha.layer,), {"backward": mha.layer.backward})
    assert reexported(mha, cls).callee == mha.reference_name
    assert reexported(ex, load_file(path).LayerNorm) is None  # the class was built before the name was rebound
    assert reexported(ex, ex.layer_class(ex.target, guard=False)).callee == LN


@pytest.mark.parametrize("name", exercises.ORDER)
def test_the_right_answer_written_out_is_not_numformers(name, tmp_path):
    ex = exercises.get(name)
    path, answer = _answer(ex, ex.target, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert result.exact and calls == []


def test_only_the_exercises_own_backward_counts_not_a_piece_it_calls(tmp_path):
    """The attention answer calls numformer's softmax_backward, the multi-head answer its attention's backward:
    neither is numformer's backward for the exercise graded, and both grade exact; a watch for the piece's own
    exercise refuses that very call, at the student's line."""
    attention, softmax = exercises.get("attention"), exercises.get("softmax")
    path, answer = _answer(attention, attention.target, tmp_path)
    assert "from numformer.layers.attention import softmax_backward" in path.read_text()
    result, calls = _graded(attention, answer, path)
    assert result.exact and calls == []
    cases = attention.cases(attention.layer_class(answer, guard=False), 0)
    pieces = calls_to_numformer(softmax, lambda: run_case(cases[0], np.random.default_rng(0)), path)
    assert pieces == [OwnCall(softmax.reference_name, str(path), _line(path, "ds = softmax_backward(dp, p)"))]
    multihead = exercises.get("multihead")
    path, answer = _answer(multihead, multihead.target, tmp_path)
    result, calls = _graded(multihead, answer, path)
    assert result.exact and calls == []


def test_the_graders_own_call_of_the_reference_runs_and_no_other(monkeypatch, tmp_path):
    """Planted: without the output guard's permit (grad_checks/exercise.py runs the reference on a copy of the
    arguments after each call of the student's function) the right answer is refused and NOT YOURS; with it, exact."""
    from grad_checks import trip_wires
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, ex.target, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert result.exact and calls == []
    monkeypatch.setattr(trip_wires, "_PERMITTED", set())
    monkeypatch.setattr("grad_checks.exercise.permit", lambda code: None)
    result, calls = _graded(ex, answer, path)
    assert not result.exact and result.not_yours and calls[0].callee == LN and calls[0].line is None


def test_what_is_watched_is_the_reference_as_written_and_its_fast_twin():
    ln, mha = exercises.get("layernorm"), exercises.get("multihead")
    assert sorted(numformer_backward_names(ln).values()) == [LN_FAST, LN]
    (code, name), = numformer_backward_names(mha).items()
    # the method as written in attention.py
    assert name == mha.reference_name and code.co_name == "backward" and code.co_filename.endswith("attention.py")


def test_a_profiler_installed_before_is_left_alone_and_sees_the_events(tmp_path):
    """The watch installs no profiler (the trip wires are in the functions themselves): a Python profiler or
    cProfile running before the grading keeps running through it and stays installed after."""
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, returns_numformers, tmp_path)
    seen = []

    def mine(frame, event, arg):
        seen.append(event)
    sys.setprofile(mine)
    try:
        with pytest.raises(RuntimeError):
            with watch(ex, path, answer):
                raise RuntimeError("the student's code failed")
        assert sys.getprofile() is mine
        result, calls = _graded(ex, answer, path)
        assert sys.getprofile() is mine and len(calls) == 1 and "call" in seen and result.not_yours
    finally:
        sys.setprofile(None)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        with watch(ex, path, answer):
            pass
        assert sys.getprofile() is profiler
    finally:
        profiler.disable()
    assert sys.getprofile() is None


# -- the grade: numformer's own backward is NOT YOURS, never EXACT ---------------------------------------------------

def test_check_says_not_yours_for_an_answer_that_calls_numformers(tmp_path):
    from grad_checks import lab
    ex = exercises.get("layernorm")
    result, status, _ = lab.check_file(str(lab_files.write(ex, returns_numformers, tmp_path)))
    assert status == 1 and not result.passed and not result.exact
    assert result.summary().startswith(f"NOT YOURS: calls numformer's own {LN} (my_layernorm.py:")
    assert "not yours: your code calls numformer's own" in str(result)
    # the same file with the reference written out is the student's own, and exact
    result, status, _ = lab.check_file(str(lab_files.write(ex, ex.target, tmp_path)))
    assert status == 0 and result.exact and result.not_yours is None


# -- what the grading thread's profiler cannot see: other threads, processes, exec (grad_checks/trip_wires.py) ------

def from_a_thread_it_starts(dy, xhat, r, gamma):
    import threading
    from numformer.layers.layernorm import layernorm_backward
    out = []
    worker = threading.Thread(target=lambda: out.append(layernorm_backward(dy, xhat, r, gamma)), name="helper")
    worker.start()
    worker.join()
    return out[0]


def from_a_thread_pool(dy, xhat, r, gamma):
    from concurrent.futures import ThreadPoolExecutor
    import numformer.layers.layernorm as L
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        return pool.submit(L.layernorm_backward, dy, xhat, r, gamma).result()


def from_numformers_own_thread_pool(dy, xhat, r, gamma):
    from numformer.kernels.host import threads
    from numformer.kernels.layernorm import layernorm_backward_fast
    return threads._get_pool(2).submit(layernorm_backward_fast, dy, xhat, r, gamma).result()


def through_a_process(dy, xhat, r, gamma):
    import subprocess
    import sys
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # (what it computes is out of the grading's sight)
    from grad_checks.exercises.layernorm import layernorm_backward as copied  # noqa: F401  (never reached: see below)


def through_exec_of_numformers_source(dy, xhat, r, gamma):
    import inspect
    import numformer.layers.layernorm as L
    namespace = dict(vars(L))
    exec(inspect.getsource(L.layernorm_backward), namespace)
    return namespace["layernorm_backward"](dy, xhat, r, gamma)


@pytest.mark.parametrize("fn, how, text", [
    (from_a_thread_it_starts, "thread", "out.append(layernorm_backward("),
    (from_a_thread_pool, "thread", None),  # the pool's thread calls it: no line of the student's on its stack
    (from_numformers_own_thread_pool, "thread", None),  # a thread started before the grading, numformer's own
    (through_exec_of_numformers_source, "exec", "exec(inspect.getsource("),
])
def test_numformers_backward_used_off_the_grading_thread_is_not_yours(fn, how, text, tmp_path):
    """The cheats of issue 61 graded EXACT before the trip wires: numformer's backward called from a worker
    thread (one the code starts, a pool's, numformer's own pool started before the grading), or its source run
    through exec. Each is found, with the student's line where one is on the stack, and the grade is NOT YOURS."""
    from numformer.kernels.host import threads
    threads._get_pool(2).submit(lambda: None).result()  # numformer's pool exists before the watch starts
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, fn, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert calls and {c.how for c in calls} == {how}, calls
    if text is not None:
        assert (calls[0].file, calls[0].line) == (str(path), _line(path, text))
    assert not result.exact and result.not_yours == describe(calls)
    assert result.summary().startswith("NOT YOURS: ")


def test_a_process_started_by_the_answer_is_named_and_not_graded_as_its_own(tmp_path):
    ex = exercises.get("layernorm")
    path, answer = _answer(ex, through_a_process, tmp_path)
    result, calls = _graded(ex, answer, path)
    assert calls[0].how == "process" and (calls[0].file, calls[0].line) == (str(path), _line(path, "subprocess.run("))
    assert "-c pass" in calls[0].detail
    assert not result.exact and result.not_yours.startswith("starts a process (")


def test_the_trip_wires_are_taken_off_after_the_grading(tmp_path):
    """The functions run their own code again, and a thread calling them later is not counted."""
    from numformer.layers.layernorm import layernorm_backward
    ex = exercises.get("layernorm")
    code = layernorm_backward.__code__
    path, answer = _answer(ex, from_a_thread_it_starts, tmp_path)
    _graded(ex, answer, path)
    assert layernorm_backward.__code__ is code
    with watch(ex, path) as calls:
        pass
    rng = np.random.default_rng(0)
    answer(rng.normal(size=(2, 4)), rng.normal(size=(2, 4)), rng.random((2, 1)), rng.normal(size=4))
    assert calls == []


def test_a_thread_started_during_the_watch_runs_numformers_freely_after_it(tmp_path):
    """A pool started while the student's code ran keeps its threads: after the watch they call numformer's
    backward unrefused and uncounted."""
    from concurrent.futures import ThreadPoolExecutor
    from numformer.layers.layernorm import layernorm_backward
    ex = exercises.get("layernorm")
    path, _ = _answer(ex, returns_numformers, tmp_path)
    rng = np.random.default_rng(0)
    args = rng.normal(size=(2, 4)), rng.normal(size=(2, 4)), rng.random((2, 1)), rng.normal(size=4)
    with watch(ex, path) as calls:
        pool = ThreadPoolExecutor(1)
        with pytest.raises(NotYours):
            pool.submit(layernorm_backward, *args).result()
    try:
        assert len(calls) == 1 and calls[0].how == "thread"
        pool.submit(layernorm_backward, *args).result()
        assert len(calls) == 1
    finally:
        pool.shutdown()


# -- issue 67: no numformer backward during a student's call, by any route ---------------------------------------
# Before, the watch counted a call only when made from the student's file: numformer's softmax_backward run as a
# torch tensor hook (called by torch's autograd engine, its caller torch's file) and a backward written as a
# @property returning super().backward (the grader itself then called numformer's method) both graded EXACT.

def softmax_through_a_torch_hook(dy, y):
    import functools
    import torch
    from numformer.layers import softmax as S
    t = torch.tensor(dy, requires_grad=True)
    out = t * 1.0
    out.register_hook(functools.partial(S.softmax_backward, y=torch.from_numpy(y)))
    out.backward(torch.from_numpy(dy))
    return t.grad.numpy()


def layernorm_through_map(dy, xhat, r, gamma):
    import functools
    import numformer.layers.layernorm as L
    return next(map(functools.partial(L.layernorm_backward, r=r, gamma=gamma), [dy], [xhat]))


def _copy_of_numformers():
    import types
    import numformer.layers.layernorm as L
    return types.FunctionType(L.layernorm_backward.__code__, vars(L), "copied")


copied = _copy_of_numformers()  # made when the student's file is imported, before any wire is on


def layernorm_through_a_copy(dy, xhat, r, gamma):
    return copied(dy, xhat, r, gamma)


PROPERTY = '''
class MultiHeadAttention(NumformerMultiHeadAttention):
    @property
    def backward(self):
        return super().backward
'''

DESCRIPTOR = '''
class Borrowed:
    def __get__(self, layer, owner=None):
        return NumformerMultiHeadAttention.backward.__get__(layer, owner)


class MultiHeadAttention(NumformerMultiHeadAttention):
    backward = Borrowed()
'''

GETATTRIBUTE = '''
class MultiHeadAttention(NumformerMultiHeadAttention):
    def backward(self, dy):
        raise NotImplementedError("never called")

    def __getattribute__(self, name):
        if name == "backward":
            return NumformerMultiHeadAttention.backward.__get__(self)
        return super().__getattribute__(name)
'''


def _class_file(ex, tmp_path, text):
    """The multi-head exercise file with its class replaced by ``text``."""
    path = lab_files.write(ex, ex.target, tmp_path)
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class MultiHeadAttention("))
    path.write_text("\n".join(lines[:start]) + "\n" + text, encoding="utf-8")
    return path


@pytest.mark.parametrize("fn, exercise", [(softmax_through_a_torch_hook, "softmax"),
                                          (layernorm_through_map, "layernorm"), (layernorm_through_a_copy, "layernorm")])
def test_numformers_backward_called_through_a_hook_or_a_builtin_is_not_yours(fn, exercise, tmp_path):
    from grad_checks import lab
    ex = exercises.get(exercise)
    path = lab_files.write(ex, fn, tmp_path)
    result, status, _ = lab.check_file(str(path))
    assert status == 1 and not result.exact and result.summary().startswith("NOT YOURS: "), str(result)
    assert result.own_uses[0].callee == ex.reference_name and result.own_uses[0].file == str(path)
    if fn is layernorm_through_a_copy:
        assert result.not_yours == f"is numformer's own {LN}, copied as copied"


@pytest.mark.parametrize("text", [PROPERTY, DESCRIPTOR, GETATTRIBUTE], ids=["property", "descriptor", "getattribute"])
def test_a_backward_resolved_to_numformers_is_not_yours(text, tmp_path):
    """What the grader calls is resolved (a property's or a descriptor's result) and compared before the call; and
    the call itself is refused, whoever makes it (``__getattribute__`` hands numformer's method to the grader)."""
    from grad_checks import lab
    ex = exercises.get("multihead")
    path = _class_file(ex, tmp_path, text)
    result, status, _ = lab.check_file(str(path))
    assert status == 1 and not result.exact and result.summary().startswith("NOT YOURS: "), str(result)
    assert result.own_uses[0].callee == ex.reference_name
    if text is PROPERTY:
        assert result.own_uses[0].how == "is" and result.own_uses[0].line == _line(path, "@property")
        assert "returned by the property backward (my_multihead.py:" in result.not_yours


def test_a_refused_call_in_a_thread_prints_no_traceback(tmp_path, capfd):
    from grad_checks import lab
    ex = exercises.get("layernorm")
    result, _, _ = lab.check_file(str(lab_files.write(ex, from_a_thread_it_starts, tmp_path)))
    assert result.not_yours and "Traceback" not in capfd.readouterr().err


class _Base:
    def backward(self, dy):
        return dy


class _Child(_Base):
    def backward(self, dy):  # a __class__ cell (super()): the trip wire keeps the same free names
        return 2 * super().backward(dy)


def test_a_method_using_super_is_wired_and_unwired(tmp_path):
    from grad_checks.trip_wires import wired
    method = _Child.backward
    assert method.__code__.co_freevars == ("__class__",)
    seen = []
    with wired({method: "_Child.backward"}, lambda *a: seen.append(a), lambda name: False):
        with pytest.raises(NotYours):
            _Child().backward(3)
    assert _Child().backward(3) == 6 and len(seen) == 1 and seen[0][0] == "_Child.backward"
