"""numformer.studies.table3 into a folder that holds other rows' results: the table keeps them. Two starts
with different --rows (the CI's small configuration cut to one seed, 4 steps, 2 dev sentences) into one
--out give one table3.md and table3.json with the rows of both; the row the first start wrote is the same
line after the second. At 2de5030 the second start's table held only its own rows."""
import json

from numformer.studies import table3
from numformer.studies.__main__ import main


def table_rows(md: str) -> dict:
    """row name -> its line in table3.md's table."""
    return {line.split("|")[1].strip(): line for line in md.splitlines()
            if line.startswith("| ") and not line.startswith("| row |")}


def test_a_second_start_with_other_rows_keeps_the_rows_of_the_first(tmp_path, capsys):
    out = tmp_path / "study"
    small = ["--small", "--seeds", "1", "--steps", "4", "--dev-sentences", "2", "--out", str(out)]
    assert main(["table3", "--rows", "A-h1", *small]) == 0
    first = table_rows((out / "table3.md").read_text(encoding="utf-8"))
    assert list(first) == ["base", "A-h1"]
    assert main(["table3", "--rows", "E", *small]) == 0
    capsys.readouterr()
    md = (out / "table3.md").read_text(encoding="utf-8")
    second = table_rows(md)
    assert list(second) == ["base", "A-h1", "E-learned"]
    assert second["A-h1"] == first["A-h1"] and second["base"] == first["base"]  # kept as measured
    numbers = json.loads((out / "table3.json").read_text(encoding="utf-8"))
    assert numbers["rows"] == ["base", "A-h1", "E-learned"]
    assert sorted((r["row"], r["seed"]) for r in numbers["runs"]) == [("A-h1", 1), ("E-learned", 1), ("base", 1)]
    assert numbers["failed"] == [] and "Check (the runs are what the rows say): every row" in md
    assert set(numbers["directions"]) == {"A", "E"}  # both groups judged
    assert sorted(p.name for p in out.iterdir()) == ["data", "table3", "table3.json", "table3.md", "table3.png"]
    assert table3.read_result(table3.run_folder(out, "A-h1", 1)) is not None
