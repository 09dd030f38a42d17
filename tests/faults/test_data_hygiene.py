"""Data said, not swallowed (issue 59): what a corpus file holds that a user did not mean is repaired or left
out, and counted where the preparation says what it did (its log line and the prepared manifest).

At 32b7b89 a U+FEFF at the start of a line inside a file (two files joined with ``cat``) became a piece of the
vocabulary, an old Mac file (lines ended by CR alone) was read as one line, and pairs with an empty side were
trained on, uncounted; an empty path flag (an unset shell variable) trained or prepared into the current
folder; ``average`` added the weights of checkpoints of different vocabularies or model configurations."""
import io
import json
import sys

import numpy as np
import pytest

import train
import translate
from numformer.checkpoint import load_checkpoint, save_checkpoint
from numformer.checkpoint_command import main as checkpoint_main
from numformer.data import plan_batches
from numformer.data.prepared_dataset import MANIFEST, prepare
from numformer.data.text_files import count_lines, read_lines
from numformer.plot import main as plot_main
from numformer.prepare import main as prepare_main
from numformer.run_file_names import PREPARED, run_checkpoints
from support import assert_one_line_error, run_main, write_corpus

LINES = ["the cat sat on the mat", "a dog ran in the park", "birds sing in the morning",
         "the sun is warm today", "we read a good book"] * 4
BOM = "\ufeff"


def corpus(folder, **files):
    """A corpus folder of LINES on every side, the named files replaced (``train_src=...``)."""
    text = "".join(line + "\n" for line in LINES)
    return write_corpus(folder, {name.replace("_", "."): data for name, data in
                                 {"train_src": text, "train_tgt": text, "valid_src": text, "valid_tgt": text,
                                  "test_src": text, "test_tgt": text, **files}.items()})


def prepared(tmp_path, folder):
    said = []
    data = prepare(tmp_path / "run", data_dir=folder, vocab_size=60, log=said.append)
    manifest = json.loads((tmp_path / "run" / PREPARED / MANIFEST).read_text())
    return data, said, manifest


def test_a_byte_order_mark_at_a_line_start_mid_file_is_dropped_and_counted(tmp_path):
    joined = "".join(line + "\n" for line in LINES[:10]) + BOM + "".join(line + "\n" for line in LINES[10:])
    folder = corpus(tmp_path / "c", train_src=joined.encode("utf-8"))
    assert read_lines(folder / "train.src")[10] == LINES[10]
    data, said, manifest = prepared(tmp_path, folder)
    pieces = [data.vocab.id_to_piece(i) for i in range(data.vocab.size)]
    assert not any(BOM in piece for piece in pieces), pieces
    assert manifest["repaired"]["bom_lines"] == 1
    assert any("1 lines starting with U+FEFF" in line for line in said), said


def test_old_mac_line_endings_are_lines_and_counted(tmp_path):
    mac = "".join(line + "\r" for line in LINES).encode("utf-8")
    folder = corpus(tmp_path / "c", train_src=mac, train_tgt=mac)
    assert read_lines(folder / "train.src") == LINES
    assert count_lines(folder / "train.src") == len(LINES)
    data, said, manifest = prepared(tmp_path, folder)
    assert len(data.ids["train"]) == len(LINES)
    assert manifest["repaired"]["cr_only_lines"] == 2 * len(LINES)
    assert any("old Mac CR line endings" in line for line in said), said


def test_pairs_with_an_empty_side_are_left_out_of_training_and_counted(tmp_path, capsys):
    tgt = "".join(("" if i in (3, 7) else line) + "\n" for i, line in enumerate(LINES))
    folder = corpus(tmp_path / "c", train_tgt=tgt)
    data, said, manifest = prepared(tmp_path, folder)
    assert manifest["empty_side_pairs"]["train"] == 2
    assert any("2 training pairs with an empty side" in line for line in said), said
    src_len, tgt_len = data.ids["train"].lengths
    plan = plan_batches(src_len, tgt_len, 400, shuffle_seed=0, max_len=64, skip_empty=True)
    kept = np.concatenate([plan[i] for i in range(len(plan))])
    assert plan.n_empty == 2 and 3 not in kept and 7 not in kept and len(kept) == len(LINES) - 2
    code = train.main(["--data", str(folder), "--preset", "tiny", "--max-steps", "1", "--out", str(tmp_path / "t"),
                       "--no-progress", "--eval-every", "0", "--no-test", "--vocab-size", "60"])
    assert code == 0
    assert "2 with an empty side left out" in capsys.readouterr().out


# -- an empty path is never meant: an unset shell variable ------------------------------------------------------

def test_train_with_an_empty_out_is_one_line_and_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # at 32b7b89 it trained into runs/copy-tiny here
    code, _, err = run_main(train.main, ["--task", "copy", "--preset", "tiny", "--max-steps", "1", "--out", "",
                                         "--no-progress", "--eval-every", "0", "--no-test"], capsys)
    assert_one_line_error(code, err, "train.py", "--out is empty")
    assert list(tmp_path.iterdir()) == []


def test_prepare_with_an_empty_out_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # at 32b7b89 it prepared into the current folder
    code, _, err = run_main(prepare_main, ["--task", "copy", "--out="], capsys)
    assert_one_line_error(code, err, "python -m numformer.prepare", "--out is empty")
    assert list(tmp_path.iterdir()) == []


def test_plot_with_an_empty_out_is_one_line(run_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # at 32b7b89 it drew into a folder named " " here
    before = sorted(p.name for p in run_copy.iterdir())
    code, _, err = run_main(plot_main, [str(run_copy), "--out", " "], capsys)
    assert_one_line_error(code, err, "python -m numformer.plot", "--out is empty")
    assert sorted(p.name for p in run_copy.iterdir()) == before


# -- average: checkpoints of one run only ------------------------------------------------------------------

def rewritten(source, target, **meta):
    """A copy of the checkpoint ``source`` whose meta has ``meta`` changed (same tensors, same shapes)."""
    ck = load_checkpoint(source, with_optimizer=False)
    save_checkpoint(target, ck.model, {**ck.meta, **meta}, vocab=ck.vocab)
    return target


def test_average_refuses_checkpoints_of_another_vocabulary(copy_run, tmp_path, capsys):
    a = run_checkpoints(copy_run)[-1]
    b = rewritten(a, tmp_path / "b.npz", vocab_sha256="0" * 64)
    code, _, err = run_main(checkpoint_main, ["average", str(a), str(b), "--out", str(tmp_path / "avg.npz")], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint", "have different vocabularies")
    assert str(b) in err and not (tmp_path / "avg.npz").exists()


def test_average_refuses_another_model_configuration_naming_the_difference(copy_run, tmp_path, capsys):
    a = run_checkpoints(copy_run)[-1]
    config = load_checkpoint(a, with_optimizer=False).meta["model_config"]
    b = rewritten(a, tmp_path / "b.npz", model_config={**config, "heads": config["heads"] * 2})
    code, _, err = run_main(checkpoint_main, ["average", str(a), str(b), "--out", str(tmp_path / "avg.npz")], capsys)
    assert_one_line_error(code, err, "python -m numformer.checkpoint",
                          f"different model configurations: heads {config['heads']} vs {config['heads'] * 2}")
    assert not (tmp_path / "avg.npz").exists()


class TypedInput(io.TextIOWrapper):
    """Standard input as a terminal gives it (translate.py then answers each line as soon as it ends)."""

    def isatty(self):
        return True


@pytest.mark.parametrize("how", ["--input", "piped", "typed"])
def test_translate_reads_old_mac_line_endings_and_mid_file_byte_order_marks_as_corpora_are_read(how, random_run,
                                                                                              tmp_path, monkeypatch,
                                                                                              capsys):
    """translate.py's input, a file, piped or typed line by line, is split and normalised as a corpus is: lines ended
    by CR alone are lines, a U+FEFF at a line's start is dropped; the translations are those of the same lines
    written plainly, one each."""
    sentences = ["the cat sat", "a dog ran", "birds sing"]
    plain = tmp_path / "plain.txt"
    plain.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    argv = ["--model", str(random_run), "--beam", "1", "--device", "cpu"]
    code, expected, err = run_main(translate.main, [*argv, "--input", str(plain)], capsys)
    assert code == 0 and len(expected.splitlines()) == len(sentences), err
    old_mac = "".join(BOM + s + "\r" for s in sentences).encode("utf-8")  # as `cat`-joined old Mac files give it
    if how == "--input":
        argv += ["--input", str(written_bytes(tmp_path / "mac.txt", old_mac))]
    else:
        stream = (TypedInput if how == "typed" else io.TextIOWrapper)(io.BytesIO(old_mac), encoding="utf-8")
        monkeypatch.setattr(sys, "stdin", stream)
    code, out, err = run_main(translate.main, argv, capsys)
    assert code == 0, err
    assert out == expected


def written_bytes(path, data):
    path.write_bytes(data)
    return path
