"""End to end on the CPU: train.py and translate.py on the reverse task, on a slice of bible-en-es,
resume equality, cached vs uncached decoding, beam search against greedy."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

import train
from numformer.checkpoint.trained_model import load_model
from numformer.data import load_parallel_dir, make_synthetic, write_parallel_dir
from numformer.decoding.search import beam_search, greedy_search
from numformer.model import Transformer
from numformer.decoding.translation import source_batch
from support import assert_same_training_state
from worst_error import record_worst

ROOT = Path(__file__).resolve().parents[2]
REVERSE_STEPS = 2000
EXACT_MIN = 0.75  # the worst of five CPU configurations measured 0.852: see the test's docstring


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory):
    """A tiny model trained on the reverse task (seed 1: the corpus train.py builds), 2,000 steps of about 500 + 500
    tokens: under 3 minutes on 2 cores (162-177 s measured), where 3,000 steps of the preset's 2,000-token batches
    took 4 to 7."""
    out = tmp_path_factory.mktemp("reverse")
    code = train.main(["--task", "reverse", "--preset", "tiny", "--max-steps", str(REVERSE_STEPS), "--max-tokens", "1000",
                       "--out", str(out), "--no-progress", "--eval-every", "500", "--eval-sentences", "50",
                       "--save-every", "500", "--no-test"])
    assert code == 0
    return out


def metrics(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def test_reverse_reaches_75_percent_exact_match(reverse_run):
    """The share of the 500 test sentences reversed exactly after 2,000 steps moves with the CPU's arithmetic,
    the valid loss hardly (0.728 to 0.734): measured on a Zen 3 without AVX-512 under five configurations of
    tests/cpu_matrix.py, 0.852 (2 threads, native; 3 threads), 0.904 (OpenBLAS Sandybridge), 0.960 (numpy
    baseline), 0.966 (1 thread, OpenBLAS Haswell: CI's xdist workers). The bound sits one spread (11 points)
    below the worst measured (docs/guarantees.md); a model that did not learn the task scores 0."""
    test_src, test_ref = make_synthetic("reverse", 20000, 500, 500, seed=1)["test"]
    inp = reverse_run / "test.src"
    inp.write_text("\n".join(test_src) + "\n")
    out = subprocess.run([sys.executable, str(ROOT / "translate.py"), "--model", str(reverse_run), "--input", str(inp)],
                         capture_output=True, text=True, check=True)
    hyps = out.stdout.split("\n")[:-1]
    assert len(hyps) == len(test_ref)
    exact = np.mean([h == r for h, r in zip(hyps, test_ref)])
    record_worst("e2e-reverse-missed", 1 - exact, f"test sentences not reversed exactly (bound {1 - EXACT_MIN:.2f})")
    assert exact > EXACT_MIN, exact


def test_cached_decoding_equals_uncached(reverse_run):
    """The trained model's weights in float64: the cached and the uncached decoder compute the same
    logits in another order, and in float32 two tokens within rounding of each other could be picked
    either way on another CPU; in float64 the searches must agree token for token, scores to 1e-10."""
    trained, vocab, _ = load_model(reverse_run)
    model = Transformer(trained.cfg, dtype=np.float64)
    model.load_state_dict(trained.state_dict())
    model.eval()
    src_text = make_synthetic("reverse", 20000, 500, 500, seed=1)["test"][0][:40]
    src = source_batch(vocab.encode(src_text), vocab.pad_id, vocab.eos_id)
    cached = greedy_search(model, src, vocab.bos_id, vocab.eos_id, use_cache=True)
    uncached = greedy_search(model, src, vocab.bos_id, vocab.eos_id, use_cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    np.testing.assert_allclose([h.logprob for h in cached], [h.logprob for h in uncached], rtol=1e-10)


def test_beam_scores_at_least_as_well_as_greedy_unless_k_hypotheses_ended_first(reverse_run):
    """On the model's own log-probability (no length penalty), beam 4 finds at least what greedy finds on 95%
    of the sentences; where it does not, fairseq's stopping rule ended the search: k hypotheses had ended
    (each an EOS among the best k candidates of its step) before the greedy path could."""
    model, vocab, _ = load_model(reverse_run)
    src_text = make_synthetic("reverse", 20000, 500, 500, seed=1)["valid"][0][:100]
    src = source_batch(vocab.encode(src_text), vocab.pad_id, vocab.eos_id)
    greedy = greedy_search(model, src, vocab.bos_id, vocab.eos_id)
    nbest = beam_search(model, src, vocab.bos_id, vocab.eos_id, beam=4, alpha=0.0, nbest=4)
    g, b = np.array([h.logprob for h in greedy]), np.array([hyps[0].logprob for hyps in nbest])
    assert np.mean(b >= g - 1e-4) >= 0.95
    for i in np.nonzero(b < g - 1e-4)[0]:
        assert len(nbest[i]) == 4 and all(len(h.tokens) < len(greedy[i].tokens) + 1 for h in nbest[i]), i
    for hyps in nbest[:5]:  # n-best lists come best first
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True) and len(hyps) == 4


def test_reverse_learning_curve_falls(reverse_run):
    m = metrics(reverse_run)
    losses = [r["train_loss"] for r in m if "train_loss" in r]
    record_worst("e2e-reverse-loss-ratio", losses[-1] / losses[0], "last / first logged loss (bound 0.5)")
    assert losses[-1] < 0.5 * losses[0]
    bleus = [r["valid_bleu"] for r in m if "valid_bleu" in r]
    assert bleus[-1] > bleus[0]
    for key in ("step", "lr", "tokens_per_s", "elapsed", "valid_loss", "valid_ppl"):
        assert any(key in r for r in m), key


@pytest.fixture(scope="module")
def bible_slice(tmp_path_factory):
    """A small user corpus cut from bible-en-es: 3000 training pairs, 40 valid, 40 test."""
    from numformer.data.bible import build_bible_corpus

    full = load_parallel_dir(build_bible_corpus())
    cut = {"train": tuple(x[:3000] for x in full["train"]), "valid": tuple(x[:40] for x in full["valid"]),
           "test": tuple(x[:40] for x in full["test"])}
    return write_parallel_dir(tmp_path_factory.mktemp("bible") / "corpus", cut)


def test_bible_slice_trains_decodes_and_scores(bible_slice, tmp_path):
    out = tmp_path / "run"
    code = train.main(["--data", str(bible_slice), "--preset", "tiny", "--vocab-size", "1000", "--max-steps", "80",
                       "--max-tokens", "1500", "--out", str(out), "--no-progress", "--eval-every", "40",
                       "--eval-sentences", "10", "--save-every", "20", "--beam", "2"])
    assert code == 0
    losses = [r["train_loss"] for r in metrics(out) if "train_loss" in r]
    record_worst("e2e-bible-loss-drop-short", 1.0 - (losses[0] - losses[-1]), "nats short of a 1.0 drop (bound 0)")
    assert losses[-1] < losses[0] - 1.0, losses
    scores = json.loads((out / "test_scores.json").read_text())
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in scores["bleu_signature"]
    hyps = (out / "test.hyp").read_text().split("\n")[:-1]
    record_worst("e2e-bible-empty", sum(not h.strip() for h in hyps) / 40, "empty test hypotheses (bound 10 of 40)")
    assert len(hyps) == 40 and sum(bool(h.strip()) for h in hyps) >= 30
    # the scores are sacreBLEU's for the written hypotheses against the test references (line for line)
    refs = bible_slice.joinpath("test.tgt").read_text(encoding="utf-8").split("\n")[:40]
    assert scores["sentences"] == 40
    # (80 steps of a tiny model translate next to nothing: the check is that the recorded numbers are the
    # scores of what was written, rounded to 2 decimals)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=0.0051)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=0.0051)
    assert len(list((out / "checkpoints").glob("step_*.npz"))) == 4  # 20, 40, 60, 80; keep-last 5


def _copy_args(out, steps):
    return ["--task", "copy", "--preset", "tiny", "--max-steps", str(steps), "--out", str(out), "--no-progress",
            "--save-every", "15", "--eval-every", "0", "--no-test", "--log-every", "5", "--max-tokens", "800"]


def test_resume_gives_the_same_run(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert train.main(_copy_args(whole, 30)) == 0
    assert train.main(_copy_args(parts, 15)) == 0
    assert train.main(_copy_args(parts, 30) + ["--resume"]) == 0
    assert_same_training_state(whole / "checkpoints" / "step_0000030.npz", parts / "checkpoints" / "step_0000030.npz")
    curve = lambda run: [(r["step"], r["train_loss"]) for r in metrics(run) if "train_loss" in r]
    assert curve(whole) == curve(parts)
    assert len(curve(whole)) == 6
