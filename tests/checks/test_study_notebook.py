"""docs/study.ipynb runs top to bottom (nbclient, a fresh kernel), its cells are docs/build_study.py's CELLS,
and the committed notebook shows its pictures (PNG outputs embedded), so the rendered notebook cannot rot."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))

nbformat = pytest.importorskip("nbformat", reason="the notebook extra: pip install -e '.[notebook]'")
pytest.importorskip("nbclient", reason="the notebook extra: pip install -e '.[notebook]'")
pytest.importorskip("ipykernel", reason="the notebook extra: pip install -e '.[notebook]'")

import build_study  # noqa: E402


def pictures(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


def test_the_committed_notebook_is_built_from_its_cells_and_shows_its_pictures():
    nb = nbformat.read(build_study.NOTEBOOK, as_version=4)
    assert build_study.sources(nb) == build_study.sources(build_study.build()), \
        "docs/study.ipynb is out of date: run python docs/build_study.py"
    runs = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert runs == list(range(1, len(runs) + 1))  # committed with the outputs of one run, top to bottom
    assert pictures(nb) >= 4  # curves, gradient flow, update ratio, activations, attention


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom():
    nb = build_study.execute(build_study.build())  # raises CellExecutionError at the first failing cell
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors
    assert pictures(nb) >= 4
    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "FAIL" not in text and " 0 failed" in text  # the gradient checks pass
