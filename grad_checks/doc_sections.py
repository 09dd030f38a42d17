"""The sections of the docs that come from the code: listings and figures no one keeps by hand.

A page holds such a section between two marks, ``<!-- gen:NAME -->`` and ``<!-- /gen:NAME -->`` (a block of
lines, or a few words inside a sentence), and :data:`SECTIONS` says how NAME is written: the exercise list as
``python -m grad_checks exercise --list`` prints it, the lines of ``exercise --status`` and of ``train.py --swap
all=DIR`` for a folder holding the LayerNorm exercise solved (run through the real commands' code on such a
folder), and the mutation testing's figures (``python -m grad_checks mutants``). A new exercise, layer or mutant
changes them; no one edits them::

    python -m grad_checks.doc_sections            # which sections are stale (exit 1 if any)
    python -m grad_checks.doc_sections --write    # write them

tests/exercises/test_doc_sections.py computes every section and compares it with the pages.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import tempfile
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from numformer.cli.arguments import OneLineParser
from numformer.cli.front import command_line

from . import exercises

ROOT = Path(__file__).resolve().parents[1]
#: The pages that hold generated sections.
PAGES = ("README.md", "docs/exercises.md")
MARK = re.compile(r"<!-- gen:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /gen:(?P=name) -->", re.S)


def _text_block(lines) -> str:
    return "\n```text\n" + "\n".join(lines) + "\n```\n"


def exercise_list(facts) -> str:
    """``exercise --list``, as a text block."""
    from .lab import list_exercises  # noqa: PLC0415

    return _text_block(list_exercises().splitlines())


@contextlib.contextmanager
def _solved_folder(name: str = "layernorm"):
    """A folder ``lab`` (in a temporary working directory) holding exercise ``name``'s file with numformer's own
    solution written in, as a student who got it right leaves it; the working directory is put back."""
    from .exercise import skeleton  # noqa: PLC0415

    ex = exercises.get(name)
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        lab = Path(tmp) / "lab"
        lab.mkdir()
        path = lab / f"my_{name}.py"
        text = skeleton(ex, exercises.number(name), len(exercises.ORDER), f"lab/{path.name}")
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(f"def {ex.target.__name__}("))
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("# numformer's"))
        answer = textwrap.dedent(inspect.getsource(ex.target)).splitlines()
        path.write_text("\n".join(lines[:start] + answer + ["", ""] + lines[end:]) + "\n", encoding="utf-8")
        os.chdir(tmp)
        try:
            yield "lab"
        finally:
            os.chdir(here)


def exercise_status(facts) -> str:
    """``exercise --status lab`` with LayerNorm's exercise solved: its line, the next one's and the count."""
    from .student_folder import folder_status, status_table  # noqa: PLC0415

    with _solved_folder() as lab:
        lines = [line for line in status_table(folder_status(lab), lab).splitlines() if line.strip()]
    i = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["layernorm"])
    return _text_block([lines[i], lines[i + 1], lines[-1]])


def swap_all_line(facts) -> str:
    """The first line ``train.py --swap all=lab`` prints for that folder: the layer swapped, numformer's own."""
    from .student_folder import swap_specs  # noqa: PLC0415

    with _solved_folder() as lab:
        _, lines = swap_specs(lab)
    return _text_block(lines[:1])


def _mutants(facts) -> dict:
    """The figures of ``python -m grad_checks mutants`` (its definitions), computed once per run."""
    if "mutants" not in facts:
        from .mutants import equivalent  # noqa: PLC0415
        from .mutation_testing import grade_mutants  # noqa: PLC0415

        with warnings.catch_warnings(), np.errstate(all="ignore"):  # mutants overflow: that is their business
            warnings.simplefilter("ignore")
            results = facts.get("mutant results") or grade_mutants()
        caught = [r for r in results if r.verdict in ("wrong", "error")]
        survived = [r for r in results if r not in caught]
        located = [r for r in caught if r.mistake is None and r.location is not None]
        facts["mutants"] = dict(
            total=len(results), caught=len(caught), wrong=sum(r.verdict == "wrong" for r in caught),
            failing=sum(r.verdict == "error" for r in caught), named=sum(r.mistake is not None for r in caught),
            located=len(located), failing_located=sum(r.verdict == "error" for r in located), survived=len(survived),
            survivors=Counter((r.mutant.exercise, r.mutant.edit) for r in survived), why=equivalent())
    return facts["mutants"]


def mutant_figures(facts) -> str:
    """docs/exercises.md's sentence of figures."""
    m = _mutants(facts)
    return (f"**{m['caught']} of {m['total']} mutants caught** ({m['wrong']} reported wrong, {m['failing']} failing "
            f"with an error line). Every caught mutant gets a diagnosis: {m['named']} named by their catalogue and "
            f"{m['located']} located to the term ({m['located'] - m['failing_located']} by the edit that reproduces "
            f"their gradients, {m['failing_located']} that raise an exception by the edits that raise the same error")


def _times(n: int) -> str:
    return {1: "once", 2: "twice", 3: "three times"}.get(n, f"{n} times")


def mutant_survivors(facts) -> str:
    """The equivalent mutants, each with how many survive and the reason its exercise gives."""
    m = _mutants(facts)
    rows = [f"* `{ex}`, `{edit.replace('`', '')}` ({_times(n)}): {m['why'].get((ex, edit), 'not a known equivalent')}"
            for (ex, edit), n in sorted(m["survivors"].items(), key=lambda kv: exercises.number(kv[0][0]))]
    return "\n" + ";\n".join(rows) + ".\n"


def readme_mutants(facts) -> str:
    """The README's sentence of figures."""
    m = _mutants(facts)
    return (f"{m['caught']} of {m['total']} single-edit mutants of the reference solutions are caught, every one of "
            f"them named or located to the term; the other {m['survived']} are equivalent")


#: name -> how it is written: ``function(facts) -> text`` (``facts``: what the sections of one run share)
SECTIONS = {
    "exercise-list": exercise_list,
    "exercise-status": exercise_status,
    "swap-all-line": swap_all_line,
    "mutant-figures": mutant_figures,
    "mutant-survivors": mutant_survivors,
    "readme-mutants": readme_mutants,
}


def rendered(text: str, facts: dict) -> str:
    """``text`` with every generated section written anew; a section name not in :data:`SECTIONS` is a KeyError."""
    def write(m):
        name = m["name"]
        if name not in SECTIONS:
            raise KeyError(f"<!-- gen:{name} --> is no section of grad_checks/doc_sections.py: {', '.join(SECTIONS)}")
        return f"<!-- gen:{name} -->{SECTIONS[name](facts)}<!-- /gen:{name} -->"
    return MARK.sub(write, text)


def stale(root: Path = ROOT, facts: dict | None = None) -> dict:
    """page -> (its text, as it should be) for every page whose generated sections are not what the code writes."""
    facts = {} if facts is None else facts
    out = {}
    for page in PAGES:
        text = (root / page).read_text(encoding="utf-8")
        want = rendered(text, facts)
        if want != text:
            out[page] = (text, want)
    return out


PROG = "python -m grad_checks.doc_sections"


@command_line(PROG)
def main(argv=None) -> int:
    """Check the generated sections (exit 1 when one is stale), or ``--write`` them."""
    ap = OneLineParser(prog=PROG, description="the docs' generated sections: check them, or --write them")
    ap.add_argument("--write", action="store_true", help="rewrite the stale sections")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    found = stale()
    for page, (_, want) in found.items():
        if args.write:
            (ROOT / page).write_text(want, encoding="utf-8")
            print(f"wrote the generated sections of {page}")
        else:
            print(f"{page}: generated sections out of date (python -m grad_checks.doc_sections --write)")
    return 1 if found and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
