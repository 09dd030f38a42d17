"""The docs' listings and figures that come from the code (grad_checks/doc_sections.py: the exercise list, the
--status and --swap all lines, the mutation testing's figures) are what the code writes now: a new exercise,
layer or mutant shows here, and ``python -m grad_checks.doc_sections --write`` rewrites them; no one edits them by
hand. (tests/exercises/test_exercises_doc.py runs the same commands and compares their output too.)"""
import pytest

from grad_checks import doc_sections


def test_every_generated_section_is_what_the_code_writes():
    found = doc_sections.stale()
    assert not found, f"stale generated sections in {', '.join(found)}: run python -m grad_checks.doc_sections --write"


def test_each_page_holds_its_sections():
    names = {page: {m["name"] for m in doc_sections.MARK.finditer((doc_sections.ROOT / page).read_text())}
             for page in doc_sections.PAGES}
    assert names["docs/exercises.md"] == set(doc_sections.SECTIONS) - {"readme-mutants"}
    assert names["README.md"] == {"readme-mutants"}


def test_a_section_edited_by_hand_is_found_and_an_unknown_one_refused():
    facts = {}
    text = "before <!-- gen:exercise-list -->\n```text\n 1  relu  (edited by hand)\n```\n<!-- /gen:exercise-list --> after"
    want = doc_sections.rendered(text, facts)
    assert want != text and want.startswith("before <!-- gen:exercise-list -->") and want.endswith("--> after")
    assert doc_sections.rendered(want, facts) == want
    with pytest.raises(KeyError, match="no section"):
        doc_sections.rendered("<!-- gen:nothing -->x<!-- /gen:nothing -->", facts)
