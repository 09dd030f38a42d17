"""The fault suite's shared inputs: a trained run folder, its Hugging Face export, a text to translate."""
import shutil

import pytest

from numformer.checkpoint_command import main as checkpoint_main


@pytest.fixture(scope="session")
def fault_inputs(copy_run, tmp_path_factory):
    """(run folder, Hugging Face folder, text file): read by the commands of tests/fault_table.py, never written."""
    base = tmp_path_factory.mktemp("fault-inputs")
    run = shutil.copytree(copy_run, base / "run")
    hf = base / "hf"
    assert checkpoint_main(["export", str(run), "--format", "hf", "--out", str(hf)]) == 0
    text = base / "in.txt"
    text.write_text("a b c d\ne f g\n", encoding="utf-8")
    return run, hf, text
