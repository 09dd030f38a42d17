"""train.py --init-from: fine-tuning an imported Marian model with its own vocabulary. Its first step's loss is
the loss transformers computes for the same batch (label smoothing 0, pads ignored), the run keeps the model's
architecture and Marian vocabulary (no new one is trained), and it resumes."""
import json

import numpy as np
import pytest

import train
from marian_files import SRC_WORDS, TGT_WORDS, fine_tune_args, sentences
from numformer import run_file_names
from numformer.checkpoint import load_checkpoint
from numformer.data import write_parallel_dir
from support import assert_one_line_error, run_main

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pairs():
    src, tgt = sentences(SRC_WORDS, 7, 12), sentences(TGT_WORDS, 8, 12)
    return {"train": (src[:8], tgt[:8]), "valid": (src[8:10], tgt[8:10]), "test": (src[10:], tgt[10:])}


def transformers_loss(folder, src, tgt) -> float:
    """MarianMTModel's own loss on the pairs as one batch: mean over the target tokens (eos included)."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(folder))
    batch = tok(src, text_target=tgt, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tok.pad_token_id] = -100
    model = MarianMTModel.from_pretrained(str(folder), torch_dtype=torch.float64).eval()
    with torch.no_grad():
        return float(model(**batch).loss)


def test_the_first_step_loss_is_transformers_loss_and_the_run_resumes(marian, pairs, tmp_path, capsys):
    case = marian("swish")
    data = write_parallel_dir(tmp_path / "data", pairs)
    out = tmp_path / "run"
    code, stdout, err = run_main(train.main, fine_tune_args(case.npz, data, out, 2), capsys)
    assert code == 0, err
    assert "vocabulary" in stdout and "Marian" in stdout
    assert (out / run_file_names.MARIAN_VOCAB).is_file() and not (out / run_file_names.VOCAB).exists()  # no new vocabulary
    first = json.loads((out / run_file_names.METRICS).read_text().splitlines()[0])
    assert first["step"] == 1
    expected = transformers_loss(case.folder, *pairs["train"])
    assert first["train_loss"] == pytest.approx(expected, rel=1e-5)  # numformer trains in float32
    run = json.loads((out / run_file_names.SETTINGS).read_text())
    assert run["init_from"] == str(case.npz.resolve()) and run["model_config"]["activation"] == "silu"
    imported, tuned = load_checkpoint(case.npz).model, load_checkpoint(run_file_names.run_checkpoints(out)[-1]).model
    assert set(tuned) == set(imported)
    assert np.array_equal(tuned["final_logits_bias"], imported["final_logits_bias"].astype(np.float32))  # frozen
    assert not np.allclose(tuned["src_embed.weight"], imported["src_embed.weight"])  # the weights trained
    code, stdout, err = run_main(train.main, ["--out", str(out), "--resume", "--max-steps", "3", "--no-progress",
                                              "--no-test"], capsys)
    assert code == 0, err
    assert json.loads((out / run_file_names.METRICS).read_text().splitlines()[-1])["step"] == 3


def test_init_from_refuses_what_would_change_the_model(marian, tmp_path, capsys):
    code, _, err = run_main(train.main, ["--init-from", str(marian("swish").npz), "--task", "copy", "--pre-norm"],
                            capsys)
    assert_one_line_error(code, err, "train.py", "leave out --pre-norm")
