"""A user's code that leaves by another door (issue 68): graded by ``python -m grad_checks check FILE`` or
trained with ``train.py --swap``, a file that exits, forks, leaves a thread running, raises KeyboardInterrupt of
its own or changes the working directory is named in one line as what it did (numformer/user_code_exits.py),
graded ERROR, never a pass, never a hang, nothing printed twice. At 4439216 ``sys.exit(0)`` or ``os._exit(0)`` at
import printed nothing and exited 0, a fork printed the grade twice, a non-daemon thread printed EXACT and never
exited, KeyboardInterrupt was the user's Ctrl-C and a changed working directory a bug report. A swapped layer's
backward returning a gradient of the wrong shape or dtype is one line naming the class, the method and the shapes;
at 4439216 a shape numpy broadcasts ((B, T, 1) into (B, T, 128)) trained to the end, exit 0."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import lab_files
from grad_checks import exercises
from support import ROOT, copy_args

DOORS = {  # what the file does -> the words its one line holds
    "sys.exit": ("import sys; sys.exit(0)", "called sys.exit(0)"),
    "os._exit": ("import os; os._exit(0)", "called os._exit(0)"),
    "fork": ("import os; os.fork()", "forked the process"),
    "thread": ("import threading, time; threading.Thread(target=time.sleep, args=(1000,)).start()",
               "started a thread"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    "chdir": ("import os; os.chdir(os.path.dirname(os.getcwd()))", "changed the working directory"),
}
WHEN = {"import": "while importing", "call": "in the graded calls"}


def right_answer(folder, name="my_layernorm.py"):
    """numformer's own LayerNorm backward written as a student's file (it grades EXACT): its text."""
    ex = exercises.get("layernorm")
    return lab_files.filled(ex, ex.target, folder / name)


def with_door(folder, door, when):
    line = DOORS[door][0]
    text = right_answer(folder)
    if when == "import":
        text += "\n" + line + "\n"
    else:  # the graded function does it, then answers right
        text += ("\n_right = layernorm_backward\n\n\ndef layernorm_backward(*args, **kwargs):\n    "
                 + line.replace("; ", "\n    ") + "\n    return _right(*args, **kwargs)\n")
    path = folder / "my_layernorm.py"
    path.write_text(text, encoding="utf-8")
    return path


def environment():
    return {**os.environ, "NUMFORMER_DEBUG": "",
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def command(argv, cwd, timeout=120):
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("when", list(WHEN))
@pytest.mark.parametrize("door", list(DOORS))
def test_a_file_that_leaves_by_another_door_is_graded_error_in_one_line(door, when, tmp_path):
    lab = tmp_path / "lab"
    lab.mkdir()
    path = with_door(lab, door, when)
    code, out, err = command(["-m", "grad_checks", "check", str(path)], cwd=lab, timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, (code, out, err[-2000:])
    assert "EXACT" not in out and "result:" not in out, out  # never a pass; no grade printed by a second process
    assert len(lines) == 1 and DOORS[door][1] in lines[0] and WHEN[when] in lines[0], err[-2000:]
    assert "graded ERROR" in lines[0] and "my_layernorm.py:" in lines[0], lines  # and where in the file
    assert "internal error" not in err


def test_a_ctrl_c_pressed_while_the_code_runs_is_still_the_users(tmp_path):
    """A real SIGINT (not the code's own KeyboardInterrupt) stops the grading as Ctrl-C does: exit 130."""
    lab = tmp_path / "lab"
    lab.mkdir()
    started = tmp_path / "started"
    path = lab / "my_layernorm.py"
    path.write_text(right_answer(lab) + f"\nimport pathlib, time\npathlib.Path({str(started)!r}).touch()\n"
                    "time.sleep(60)\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "grad_checks", "check", str(path)], cwd=lab, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.strip().splitlines() == ["python -m grad_checks: interrupted"], err


def test_exercise_status_goes_on_past_a_file_that_exits(tmp_path):
    """``exercise --status DIR``: the exiting file is a row that does not check, the others are graded."""
    lab = tmp_path / "lab"
    lab.mkdir()
    with_door(lab, "sys.exit", "import")
    ex = exercises.get("softmax")
    lab_files.write(ex, ex.target, lab)
    code, out, err = command(["-m", "grad_checks", "exercise", "--status", str(lab)], cwd=lab, timeout=120)
    assert code == 1, (code, out, err[-2000:])
    rows = {line.split()[1]: line for line in out.splitlines() if line[:2].strip().isdigit()}
    assert "error" in rows["layernorm"] and "called sys.exit(0)" in rows["layernorm"], out
    assert "EXACT" in rows["softmax"], out


def swap_file(folder, body, name="my_layernorm.py"):
    path = folder / name
    path.write_text("from numformer.layers.layernorm import LayerNorm as Numformers\n\n\n"
                    "class LayerNorm(Numformers):\n    def backward(self, dy):\n" + body, encoding="utf-8")
    return path


def train_with_swap(path, tmp_path, steps=2):
    return command([str(ROOT / "train.py"), *copy_args(tmp_path / "run", steps), "--swap",
                    f"LayerNorm={path}:LayerNorm"], cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("body, words", [
    ("        return super().backward(dy)\n\n\nimport sys\nsys.exit(0)\n", "called sys.exit(0) while importing"),
    ("        import os\n        os._exit(0)\n", "called os._exit(0) while its backward was graded"),
    ("        import threading, time\n        threading.Thread(target=time.sleep, args=(1000,)).start()\n"
     "        return super().backward(dy)\n", "started a thread"),
], ids=["sys.exit at import", "os._exit graded", "thread graded"])
def test_a_swapped_file_that_leaves_by_another_door_is_one_line(body, words, tmp_path):
    code, out, err = train_with_swap(swap_file(tmp_path, body), tmp_path)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, err[-2000:])
    assert "--swap LayerNorm" in lines[0] and words in lines[0] and "graded ERROR" in lines[0], lines
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("body, returned", [
    ("        return super().backward(dy).sum(axis=-1, keepdims=True)\n", r"\(\d+, \d+, 1\) float32"),  # broadcasts
    ("        return super().backward(dy).astype('float64')\n", r"\(\d+, \d+, 128\) float64"),
    ("        dx = super().backward(dy)\n        return dx.reshape(-1, dx.shape[-1])\n", r"\(\d+, 128\) float32"),
], ids=["broadcastable (B, T, 1)", "float64", "flattened"])
def test_a_swapped_backward_returning_a_wrong_shape_or_dtype_is_one_line(body, returned, tmp_path):
    code, out, err = train_with_swap(swap_file(tmp_path, body), tmp_path)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, err[-2000:])
    line = lines[0]
    assert "LayerNorm.backward" in line, line
    assert re.search(r"returned a gradient of shape " + returned + r" for the input x of shape \(\d+, \d+, 128\) "
                     "float32", line), line
    assert "internal error" not in err
