"""The fault suite's table: every command that writes, run as a user runs it, with a fault injected at the
moment a finished temporary is about to become its target (numformer.files' one ``os.replace``).

Each row names the command line and the path it writes. The harness starts the command in a fresh process
with one fault armed in :mod:`numformer.files` (and only there):

* ``sigkill``: the process kills itself with SIGKILL (a power cut, the OOM killer): nothing can clean up;
* ``sigint``: ``KeyboardInterrupt`` is raised there (Ctrl-C);
* ``enospc``: ``OSError(ENOSPC)`` is raised there (the disk filled);
* ``sigterm``, ``sighup``: the process sends itself SIGTERM (a scheduler's stop, ``kill``) or SIGHUP (the
  terminal closed) there, which the front handles as Ctrl-C.

What must hold (tests/faults/): the target is as it was (absent, or its old bytes), one line says what
happened with the right exit status, nothing is left behind except after SIGKILL, whose temporary the next
run of the command removes, saying so. A command that writes without the atomic writer never meets the
fault, and its row fails with "the fault never fired". A new command that writes joins ROWS.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import ROOT, as_a_terminal_starts_it

FAULTS = ("sigkill", "sigint", "enospc", "sigterm", "sighup")
PARTIAL_MARK = ".numformer-partial-"

# Armed in the child before the command runs: the first os.replace numformer.files makes meets the fault.
HARNESS = r"""
import errno, os, signal, sys, types
fault, marker = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
sys.path.insert(0, {root!r})
import numformer.files as files
real_replace = os.replace
def replace(src, dst, *a, **k):
    with open(marker, "w") as f:
        f.write(f"{{src}}\n{{dst}}\n")
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "sigint":
        raise KeyboardInterrupt
    if fault == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if fault in ("sigterm", "sighup"):
        os.kill(os.getpid(), getattr(signal, fault.upper()))
    return real_replace(src, dst, *a, **k)
files.os = types.SimpleNamespace(**{{k: getattr(os, k) for k in dir(os) if not k.startswith("__")}})
files.os.replace = replace
import runpy
if sys.argv[0].endswith(".py"):
    sys.path.insert(0, os.path.dirname(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@dataclass
class Row:
    """A command that writes: ``argv`` (a script path or ``-m module`` first), the path it writes."""
    name: str
    argv: list
    target: Path
    needs: str | None = None  # an optional package the command needs (installed by .ci/setup)


def rows(run: Path, hf: Path, text: Path, out: Path) -> list[Row]:
    """The table, for a trained run folder ``run``, a Hugging Face folder ``hf``, a text file ``text``, writing
    under ``out``."""
    ck = ["-m", "numformer.checkpoint"]
    return [
        Row("translate", [str(ROOT / "translate.py"), "--model", str(run), "--input", str(text), "--output",
                          str(out / "hyp.txt"), "--greedy"], out / "hyp.txt"),
        Row("export-npz", [*ck, "export", str(run), "--out", str(out / "m.npz")], out / "m.npz"),
        Row("export-safetensors", [*ck, "export", str(run), "--out", str(out / "m.safetensors")],
            out / "m.safetensors"),
        Row("export-hf", [*ck, "export", str(run), "--format", "hf", "--out", str(out / "hf")], out / "hf"),
        Row("export-ctranslate2", [*ck, "export", str(run), "--format", "ctranslate2", "--out", str(out / "ct2")],
            out / "ct2", needs="ctranslate2"),
        Row("average", [*ck, "average", "--last", "2", str(run), "--out", str(out / "avg.npz")], out / "avg.npz"),
        Row("import", [*ck, "import", str(hf), "--out", str(out / "imported.npz")], out / "imported.npz"),
        Row("plot", ["-m", "numformer.plot", str(run), "--out", str(out / "plots")], out / "plots" / "curves.png"),
        Row("prepare", ["-m", "numformer.prepare", "--task", "copy", "--out", str(out / "prepared")],
            out / "prepared"),
        Row("exercise", ["-m", "grad_checks", "exercise", "layernorm", "--force", "--out", str(out / "lab")],
            out / "lab" / "my_layernorm.py"),
        Row("study", ["-m", "numformer.studies", "ln-placement", "--small", "--out", str(out / "study")],
            out / "study" / "ln-placement.png"),
        Row("train", [str(ROOT / "train.py"), "--task", "copy", "--preset", "tiny", "--max-steps", "2", "--out",
                      str(out / "run"), "--no-progress", "--eval-every", "0", "--no-test", "--max-tokens", "200"],
            out / "run"),
    ]


def row_names() -> list[str]:
    """The rows' names (for parametrize: the paths are the test's own)."""
    return [r.name for r in rows(*(Path("."),) * 4)]


def run(argv: list, cwd: Path, fault: str | None = None, timeout: float = 300) -> tuple[int, str, Path | None]:
    """Run one command line in a fresh process (with ``fault`` armed); -> (exit status, stderr, the path the
    fault met: the target of the first atomic replace, None when no fault was armed or it never fired)."""
    env = {**os.environ, "NUMFORMER_DEBUG": "", "TMPDIR": str(cwd),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    args = argv[1:] if argv[0] == "-m" else argv
    if fault is None:
        cmd = [sys.executable, *argv]
    else:
        marker = cwd / f"fault-{fault}.txt"
        cmd = [sys.executable, "-c", HARNESS.format(root=str(ROOT)), fault, str(marker), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=as_a_terminal_starts_it)
    met = None
    if fault is not None and (cwd / f"fault-{fault}.txt").exists():
        met = Path((cwd / f"fault-{fault}.txt").read_text().splitlines()[1])
    return proc.returncode, proc.stderr, met


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (names relative to it) -> its bytes: what "nothing lost" compares."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def partials(folder: Path) -> list[Path]:
    """The temporaries of the atomic writer anywhere under ``folder``."""
    return sorted(p for p in folder.rglob(f"*{PARTIAL_MARK}*"))


def fresh_out(tmp_path: Path, row_name: str) -> Path:
    out = tmp_path / row_name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out
