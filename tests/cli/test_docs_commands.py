"""The README and docs/ stay true to the tree: every command they show is in tests/check_docs_commands.py's
table (which runs them, by hand), every path and test they name exists, the README's layout table lists
numformer/ as it is, and the README stays a front door (at most about 250 lines). Runs in about a second."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import check_docs_commands as docs  # noqa: E402

TEXTS = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in docs.DOCS}


def test_every_command_shown_is_in_the_checked_table_and_no_other():
    shown = docs.shown_commands()
    assert sorted(set(shown) - set(docs.COMMANDS)) == [], "add these to tests/check_docs_commands.py's COMMANDS"
    assert sorted(set(docs.COMMANDS) - set(shown)) == [], "no document shows these any more: remove them"
    assert all(kind in ("run", "small", "skip", docs.NO_GPU) for kind, _ in docs.COMMANDS.values())


def test_a_planted_command_is_seen(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\npython3 train.py --task copy   # a comment\nfor x in a b; do\n  echo $x\ndone\n```\n")
    assert docs.shown_commands([page]).keys() == {"python3 train.py --task copy", "for x in a b; do ... done"}


def test_every_path_named_exists():
    pattern = re.compile(r"`((?:numformer|tests|bench|docs|grad_checks)/[\w./-]*\w)`")
    missing = {(name, path) for name, text in TEXTS.items() for path in pattern.findall(text)
               if not (ROOT / path).exists()}
    assert not missing, missing


def test_every_test_named_exists():
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    named = {(name, t) for name, text in TEXTS.items() for t in re.findall(r"`(test_\w+)`", text)}
    assert {(n, t) for n, t in named if t not in defined} == set()


def test_the_readme_layout_table_matches_the_tree():
    text = TEXTS["README.md"]
    table = text[text.index("## Layout"):]
    table = table[:table.index("\n## ")]
    listed = set(re.findall(r"`([\w./-]+)`", table))
    top = {p.name for p in ROOT.iterdir()}
    for entry in listed:
        if entry.split("/")[0] in top:
            assert (ROOT / entry).exists(), entry
    tree = {f"numformer/{p.name}" + ("/" if p.is_dir() else "") for p in (ROOT / "numformer").iterdir()
            if p.name not in ("__init__.py", "__pycache__")}
    tree |= {"train.py", "translate.py", "grad_checks/", "tests/", "bench/", "docs/"}
    assert sorted(tree - listed) == [], "the layout table lacks these"


def test_the_readme_is_a_front_door():
    assert len(TEXTS["README.md"].splitlines()) <= 250
    assert TEXTS["README.md"].lstrip().startswith("# numformer\n\n```bash\nbash .ci/setup && python3 train.py --task")
