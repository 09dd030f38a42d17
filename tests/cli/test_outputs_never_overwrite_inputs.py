"""An output path that is an input is refused before anything is read (issue 40's "saved work destroyed"):
``python -m numformer.checkpoint export CK --out CK`` and ``average CK --out CK`` rewrote a training checkpoint
without its optimizer state at 2de5030 (exit 0), and ``train.py --resume`` then refused the run. Every case:
one line, exit 2, the input's bytes unchanged. Writing a new file into a run folder stays allowed."""
import os

import pytest

from numformer.checkpoint_command import main
from numformer.files import refuse_output_over_inputs
from numformer.errors import UsageError
from support import assert_one_line_error, run_main


def _checkpoints(run):
    return sorted((run / "checkpoints").glob("step_*.npz"))


@pytest.mark.parametrize("command", ["export", "average"])
def test_a_checkpoint_written_over_itself_is_refused_and_kept(run_copy, capsys, command):
    ck = _checkpoints(run_copy)[-1]
    before = ck.read_bytes()
    code, _, err = run_main(main, [command, str(ck), "--out", str(ck)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "would overwrite the input")
    assert ck.read_bytes() == before


def test_a_link_to_the_input_is_the_input(run_copy, tmp_path, capsys):
    ck = _checkpoints(run_copy)[-1]
    before = ck.read_bytes()
    link = tmp_path / "link.npz"
    os.symlink(ck, link)
    code, _, err = run_main(main, ["average", str(ck), "--out", str(link)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "would overwrite the input")
    assert ck.read_bytes() == before and link.is_symlink()


def test_the_run_folder_itself_or_the_model_file_it_serves_is_refused(run_copy, capsys):
    code, _, err = run_main(main, ["average", "--last", "2", str(run_copy), "--out", str(run_copy / "averaged.npz")],
                            capsys)
    assert code == 0, err                        # a new file in the run folder: allowed
    served = (run_copy / "averaged.npz").read_bytes()
    code, _, err = run_main(main, ["export", str(run_copy), "--out", str(run_copy / "averaged.npz")], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "would overwrite the input")
    assert (run_copy / "averaged.npz").read_bytes() == served
    code, _, err = run_main(main, ["export", str(run_copy), "--format", "hf", "--out", str(run_copy)], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "would overwrite the input")


def test_an_empty_out_says_so(run_copy, capsys):
    code, _, err = run_main(main, ["export", str(run_copy), "--out", ""], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "--out is empty")


def test_an_input_inside_the_output_folder_is_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="would overwrite the input"):
        refuse_output_over_inputs(tmp_path, [tmp_path / "hf"])
    refuse_output_over_inputs(tmp_path / "new.npz", [tmp_path / "hf"])   # beside it: fine


@pytest.mark.parametrize("what", ["model", "reference"])
def test_translations_never_overwrite_the_model_or_the_references(run_copy, tmp_path, capsys, what):
    import translate

    ck = _checkpoints(run_copy)[-1]
    src, ref = tmp_path / "in.txt", tmp_path / "ref.txt"
    src.write_text("a b\n")
    ref.write_text("a b\n")
    victim = ck if what == "model" else ref
    before = victim.read_bytes()
    code, _, err = run_main(translate.main, ["--model", str(ck), "--input", str(src), "--reference", str(ref),
                                             "--output", str(victim)], capsys)
    assert_one_line_error(code, err, "translate.py", "would overwrite the input")
    assert victim.read_bytes() == before
