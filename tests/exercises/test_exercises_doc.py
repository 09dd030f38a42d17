"""docs/exercises.md runs as written: its commands, run in order in an empty folder (as from a fresh clone's
root), print what the page shows; its Python blocks run; the function bodies it tells the reader to write give
the diagnosis and then the exact grade it shows. Two changes only: train.py's 300 steps become 3 (the real
runs are measured by hand and quoted on the page), and the bible-en-es runs are left out (a corpus build and
minutes of training). The README's example of check() runs too."""
import os
import re
import subprocess
import sys
from pathlib import Path

from grad_checks import exercises

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "exercises.md"
README = ROOT / "README.md"
NUMBER = re.compile(r"[-+]?\d\.\d+e[-+]\d\d")  # finite-difference errors: round-off differs across machines


def blocks(text):
    """(language, body) of every fenced block, in order."""
    return [(m[1], m[2]) for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S)]


def run(command, cwd, env):
    command = command.replace("python -m grad_checks", f"{sys.executable} -m grad_checks")
    command = command.replace("python3 train.py", f"{sys.executable} {ROOT / 'train.py'}")
    command = command.replace("--max-steps 300", "--max-steps 3")
    done = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def normalized(text):
    return [NUMBER.sub("N", line).rstrip() for line in text.splitlines()]


def test_the_walk_through_runs_as_written(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    output, ran, folders = "", [], {}
    for lang, body in blocks(DOC.read_text()):
        if lang == "bash":
            output = ""
            for command in [c for c in body.splitlines() if c.strip()]:
                if "bible-en-es" in command:
                    continue
                written = re.search(r"exercise (\w+) --out (\S+)", command)
                if written:  # where the answer the page shows next goes
                    folders[written[1]] = written[2]
                code, out = run(command, tmp_path, env)
                assert code in (0, 1), (command, out)  # 1: a check that grades a wrong answer
                assert "Traceback" not in out, (command, out)
                output += out
                ran.append(command)
        elif lang == "text" and output:
            got = normalized(output)
            for line in normalized(body):
                if line.strip() and line.strip() != "...":
                    assert line in got, (line, output)
        elif lang == "python" and re.match(r"def \w+_backward\(", body):
            # an answer the page tells the reader to write: into the exercise file a command above wrote
            name = re.match(r"def (\w+)\(", body)[1]
            ex = next(e for e in exercises.all_exercises() if e.target.__name__ == name)
            path = tmp_path / folders.get(ex.name, "lab") / f"my_{ex.name}.py"
            text = path.read_text()
            start = text.index(f"def {name}(")
            end = text.index("# numformer's ", start)
            path.write_text(text[:start] + body + "\n\n" + text[end:])
        elif lang == "python":
            script = tmp_path / "block.py"
            script.write_text(body)
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            output = done.stdout
    assert any("train.py" in c and "--swap" in c for c in ran) and any(" check " in c for c in ran)


def test_the_readme_example_checks_its_own_layer(tmp_path):
    body = next(b for lang, b in blocks(README.read_text()) if lang == "python" and "finite_differences import check" in b)
    script = tmp_path / "example.py"
    script.write_text(body)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "passed: 2 tensors" in done.stdout and "input:x" in done.stdout
