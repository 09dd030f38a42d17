"""Every command line has the one front (numformer/cli/front.py): found by walking the project for
``if __name__ == "__main__"``, so a command added later is checked without being listed here.

* it wears ``@command_line``: its whole main, argument parsing included, runs inside the one-line errors;
* a flag it does not know is one line ``PROG: error: ...``, exit 2, no usage block;
* an exception nobody raised on purpose (planted in argparse, which every command calls first) is a bug:
  one line saying so and naming the file its traceback went to, which holds the traceback; exit 1.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numformer.cli.front import FRONT_ATTRIBUTE
from support import ROOT

GUARD = 'if __name__ == "__main__"'


def command_files() -> list[Path]:
    """Every file a user runs: the project's modules and scripts with a __main__ guard (tests/ aside)."""
    found = [ROOT / "train.py", ROOT / "translate.py"]
    for folder in ("numformer", "grad_checks", "bench"):
        found += [p for p in sorted((ROOT / folder).rglob("*.py")) if GUARD in p.read_text(encoding="utf-8")]
    return found


def module_name(path: Path) -> str | None:
    """The importable name of a package module (None for a script in bench/)."""
    rel = path.relative_to(ROOT).with_suffix("")
    if rel.parts[0] == "bench":
        return None
    return ".".join(rel.parts)


COMMANDS = command_files()
PACKAGE_COMMANDS = [p for p in COMMANDS if module_name(p) is not None]
IDS = [str(p.relative_to(ROOT)) for p in COMMANDS]


def load_main(path: Path):
    name = module_name(path)
    if name is not None:
        return importlib.import_module(name).main
    # a bench script: read, not run (its module code may tune threads or load libraries)
    text = path.read_text(encoding="utf-8")
    assert "@command_line(PROG)\ndef main(" in text, f"{path} must wear @command_line(PROG) on its main"
    return None


def test_the_walk_finds_the_commands_the_readme_names():
    names = {str(p.relative_to(ROOT)) for p in COMMANDS}
    assert {"train.py", "translate.py", "numformer/checkpoint/__main__.py", "grad_checks/__main__.py",
            "numformer/studies/__main__.py", "numformer/plot.py", "bench/decode.py"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_every_command_wears_the_front(path):
    main = load_main(path)
    if main is not None:
        assert getattr(main, FRONT_ATTRIBUTE, None), f"{path}: its main is not wrapped by @command_line"


def run_script(path: Path, argv: list, tmp_path: Path, plant: bool = False) -> tuple[int, str]:
    """Run a command in a fresh process (as a user does); with ``plant``, argparse raises a RuntimeError."""
    name = module_name(path)
    runner = f"import runpy; runpy.run_module({name!r}, run_name='__main__', alter_sys=True)" if name else \
        f"import runpy, sys; sys.path.insert(0, {str(path.parent)!r}); runpy.run_path({str(path)!r}, run_name='__main__')"
    plant_code = ("import argparse\n"
                  "def broken(self, *a, **k):\n"
                  "    raise RuntimeError('planted bug')\n"
                  "argparse.ArgumentParser.parse_known_args = broken\n") if plant else ""
    code = f"import sys; sys.argv = [{str(path)!r}, *{argv!r}]\n{plant_code}{runner}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "NUMFORMER_DEBUG": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr


def prog_of(path: Path) -> str:
    return str(path.relative_to(ROOT)) if module_name(path) is None or path.parent == ROOT else ""


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_an_unknown_flag_is_one_line_and_exit_2(path, tmp_path):
    code, err = run_script(path, ["--no-such-flag-anywhere"], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and ": error: " in lines[0] and "usage:" not in err, err
    assert lines[0].startswith(prog_of(path)), err


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_a_bug_says_it_is_one_and_where_its_traceback_went(path, tmp_path):
    code, err = run_script(path, ["--help"], tmp_path, plant=True)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1, (code, err)
    assert len(lines) == 1 and "internal error (a bug in numformer" in lines[0], err
    assert "Traceback" not in err
    log = Path(lines[0].split("the traceback is in ", 1)[1].split(":", 1)[0])
    assert log.is_file() and log.parent == tmp_path, lines[0]
    text = log.read_text(encoding="utf-8")
    assert "Traceback" in text and "planted bug" in text


@pytest.mark.parametrize("path", COMMANDS, ids=IDS)
def test_help_prints_and_exits_0(path, tmp_path):
    """``--help`` is what a new user types first: it must print, not crash (a bare '%' in a help string made
    argparse's formatting raise, which train.py reported as a bug of ours)."""
    code, err = run_script(path, ["--help"], tmp_path)
    assert code == 0 and "internal error" not in err, err
