"""Ctrl-C and a full disk at the moment a command's finished temporary is about to become its target
(tests/fault_table.py): one line and the right exit status (130; 2, naming the file and the space), the
target keeps its old bytes, and nothing is left behind."""
import importlib.util

import pytest

from fault_table import fresh_out, partials, row_names, rows, run, snapshot

OLD = b"old bytes: never lost\n"
# Two rows run in test_killed_writes.py only, where a kill leaves something to clean up: CTranslate2's folder is
# written by the same atomic_folder as the Hugging Face one (export-hf) and its converter takes 15 s to import; a
# study writes through the same atomic_write as plot (its small run takes 10 s before it writes).
ROW_NAMES = [n for n in row_names() if n not in ("export-ctranslate2", "study")]


def arranged(name, tmp_path, fault_inputs):
    out = fresh_out(tmp_path, name)
    row = next(r for r in rows(*fault_inputs, out) if r.name == name)
    if row.needs and importlib.util.find_spec(row.needs) is None:
        pytest.skip(f"{row.name} needs {row.needs} (installed by .ci/setup)")
    if row.target.suffix:
        row.target.parent.mkdir(parents=True, exist_ok=True)
        row.target.write_bytes(OLD)
    return row, out


def faulted(name, tmp_path, fault_inputs, fault):
    """Run the row with ``fault`` armed: (its output folder, that folder's files before, exit status, stderr,
    the path the fault met), the fault checked to have fired."""
    row, out = arranged(name, tmp_path, fault_inputs)
    before = snapshot(out)
    code, err, met = run(row.argv, tmp_path, fault)
    assert met is not None, f"the fault never fired: {name} does not write through numformer.files ({err[-500:]})"
    return out, before, code, err, met


def error_lines(err):
    """stderr's lines, less progress and log lines a command prints before it fails."""
    return [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("data:", "numformer: removed"))]


@pytest.mark.parametrize("name", ROW_NAMES)
def test_ctrl_c_leaves_the_target_and_no_temporary(name, tmp_path, fault_inputs):
    out, before, code, err, met = faulted(name, tmp_path, fault_inputs, "sigint")
    assert code == 130, (code, err[-2000:])
    last = error_lines(err)[-1]
    assert last.endswith("interrupted") or name == "train", err[-2000:]
    if name == "train":  # a run also says what is saved and what to do (train.py's RunPhase)
        assert last.endswith("interrupted (Ctrl-C) before training started: nothing was trained; run the same "
                             "command again"), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert partials(out) == []
    after = snapshot(out)
    assert {k: after.get(k) for k in before} == before  # what was there is whole


@pytest.mark.parametrize("name", ROW_NAMES)
def test_a_full_disk_is_one_line_naming_the_file_and_nothing_changes(name, tmp_path, fault_inputs):
    out, before, code, err, met = faulted(name, tmp_path, fault_inputs, "enospc")
    assert code == 2, (code, err[-2000:])
    lines = error_lines(err)
    assert len(lines) == 1 and "no space left on the disk of" in lines[0] and str(met) in lines[0], err[-2000:]
    assert "MB" in lines[0] and "Traceback" not in err
    assert partials(out) == []
    assert snapshot(out) == before  # nothing written, nothing lost (a refused run puts its folder back)
