"""What numformer offers its own models works on an imported Marian model: translate.py translates with the model
file, the finite-difference checks run on its trained weights (pad-row rule, SiLU, frozen logits bias included),
and a fine-tuning run logs per-tensor gradient statistics and the noise scale (--log-grads), writes TensorBoard's
histograms, and takes a student's layer (--swap) while computing the same losses."""
import json

import pytest

import train
import translate
from grad_checks import exercises
from grad_checks.__main__ import main as grad_checks_main
from lab_files import write as write_exercise_file
from marian_files import SRC_WORDS, TGT_WORDS, fine_tune_args, sentences
from numformer.checkpoint import load_checkpoint
from numformer.checkpoint.trained_model import load_model
from numformer.data import write_parallel_dir
from numformer.decoding.translation import DecodeOptions, translate_lines
from numformer.kernels import kernel_mode
from support import run_main

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    src, tgt = sentences(SRC_WORDS, 5, 16), sentences(TGT_WORDS, 6, 16)
    return write_parallel_dir(tmp_path_factory.mktemp("pairs"),
                              {"train": (src[:12], tgt[:12]), "valid": (src[12:14], tgt[12:14]),
                               "test": (src[14:], tgt[14:])})


def test_translate_py_translates_with_the_imported_file(marian, tmp_path, capsys):
    case = marian("swish")
    lines = sentences(SRC_WORDS, 9, 5)
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _, err = run_main(translate.main, ["--model", str(case.npz), "--input", str(tmp_path / "in.txt"), "--output",
                                             str(tmp_path / "out.txt"), "--greedy", "--max-len-a", "0",
                                             "--max-len-b", "8"], capsys)
    assert code == 0, err
    model, vocab, _ = load_model(case.npz)
    expected = translate_lines(model, vocab, lines, DecodeOptions(beam=1, max_len_a=0.0, max_len_b=8))
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    assert any(expected)


def test_grad_checks_pass_on_the_imported_weights(marian, capsys):
    """The layers the Marian pieces touch (the feed-forward's SiLU, the embedding's pad-row rule) and the whole
    model with its loss (the frozen logits bias, the decoder started from pad), on opus-mt's activation; the
    whole model check takes most of the time, and the ReLU variant's gradients are checked against
    transformers' autograd in test_marian_import.py."""
    npz = marian("swish").npz
    capsys.readouterr()   # what building the fixture printed
    code = grad_checks_main(["--checkpoint", str(npz), "--json", "--layer", "FeedForward", "--layer", "Embedding",
                             "--layer", "Transformer"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["failed"] == 0
    assert report["checks"] >= 30   # every tensor of the whole model, besides the layers
    assert report["max_rel_error"] < 1e-6


def test_fine_tuning_logs_gradients_noise_scale_and_histograms(marian, data, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    case = marian("swish")
    out = tmp_path / "run"
    code, _, err = run_main(train.main, fine_tune_args(case.npz, data, out, 2) + ["--log-grads", "1", "--tensorboard"],
                            capsys)
    assert code == 0, err
    records = [json.loads(x) for x in (out / "grad_stats.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    trained = {k for k in load_checkpoint(case.npz).model if k != "final_logits_bias"}  # the bias is frozen
    for r in records:
        assert set(r["params"]) == trained
        assert set(r["noise"]["tensors"]) == trained and r["noise"]["total"]["trace"] is not None
    events = EventAccumulator(str(out), size_guidance={"histograms": 0}).Reload()
    histograms = events.Tags()["histograms"]
    assert any("src_embed" in tag for tag in histograms) and any("ffn" in tag for tag in histograms)


def test_a_swapped_silu_fine_tunes_to_the_same_losses(marian, data, tmp_path, capsys):
    """The imported opus-mt-like model's SiLU (the fourteenth exercise), solved in a student's file and swapped in:
    on the plain math the run logs numformer's losses exactly."""
    ex = exercises.get("silu")
    student = write_exercise_file(ex, ex.target, tmp_path)
    case = marian("swish")
    losses = {}
    with kernel_mode("plain"):
        for name, extra in (("own", []), ("swapped", ["--swap", f"SiLU={student}:{ex.layer.__name__}"])):
            code, stdout, err = run_main(train.main, fine_tune_args(case.npz, data, tmp_path / name, 3) + extra,
                                         capsys)
            assert code == 0, err
            losses[name] = [json.loads(x)["train_loss"] for x in (tmp_path / name / "metrics.jsonl").read_text()
                            .splitlines() if "train_loss" in x]
    assert "SiLU" in stdout
    assert len(losses["own"]) == 3 and losses["swapped"] == losses["own"]
