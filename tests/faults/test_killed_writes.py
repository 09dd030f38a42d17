"""SIGKILL at the moment a command's finished temporary is about to become its target (tests/fault_table.py):
the target keeps its old bytes, the one temporary left carries the writer's recognisable name, and the next
run of the same command removes it, says so in one line, and succeeds."""
import importlib.util

import pytest

from fault_table import fresh_out, partials, row_names, rows, run, snapshot

OLD = b"old bytes: never lost\n"
ROW_NAMES = row_names()


def arrange(row, tmp_path, fault_inputs):
    """The row for this test's folder, with an old file at the target where it is one file."""
    if row.needs and importlib.util.find_spec(row.needs) is None:
        pytest.skip(f"{row.name} needs {row.needs} (installed by .ci/setup)")
    if row.target.suffix:
        row.target.parent.mkdir(parents=True, exist_ok=True)
        row.target.write_bytes(OLD)
    return row


@pytest.mark.parametrize("name", ROW_NAMES)
def test_sigkill_loses_nothing_and_the_next_run_cleans_up(name, tmp_path, fault_inputs):
    out = fresh_out(tmp_path, name)
    row = arrange(next(r for r in rows(*fault_inputs, out) if r.name == name), tmp_path, fault_inputs)
    before = snapshot(out)
    code, err, met = run(row.argv, tmp_path, "sigkill")
    assert met is not None, f"the fault never fired: {name} does not write through numformer.files ({err[-500:]})"
    assert code == -9, (code, err[-2000:])
    left = partials(out)  # the killed write's (a command writing two files at once leaves two)
    assert f".{met.name}" in [p.name.split(".numformer-partial-")[0] for p in left], left
    after = snapshot(out)
    assert {k: v for k, v in after.items() if ".numformer-partial-" not in k and k in before} == before
    if row.target.suffix:
        assert row.target.read_bytes() == OLD  # the old file, whole
    code, err, _ = run(row.argv, tmp_path)
    assert code == 0, err[-2000:]
    assert partials(out) == []
    assert "removed what a killed write left in" in err and all(p.name in err for p in left), err
