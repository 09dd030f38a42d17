"""The length penalty chosen on the validation split (numformer/decoding/valid_choice.py): re-ranking one beam
search's finished hypotheses gives exactly what a beam search with each alpha returns; the best validation BLEU
wins (a tie: the alpha nearest the paper's); train.py writes the choice to the run within its time and uses it,
translate.py reads it back, and ``--alpha`` overrides both."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer import run_file_names
from numformer.decoding import valid_choice
from numformer.decoding.translation import DecodeOptions, translate_ids
from numformer.checkpoint.run_model_file import run_folder_of
from numformer.decoding.valid_choice import ALPHAS, best_under, read_choice
from numformer.model import Transformer
from numformer.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
import translate  # noqa: E402
from support import copy_args  # noqa: E402


def test_re_ranking_the_finished_hypotheses_is_beam_search_with_that_alpha():
    # a vocabulary of 8: EOS (id 3) is likely enough that hypotheses finish at different lengths, which is
    # where alpha matters (with 30 or more, a random model ends every hypothesis at the length limit)
    model = Transformer(get_preset("tiny", vocab_size=8, d_model=16, d_ff=32, heads=2, max_len=64), seed=0,
                        dtype=np.float64).eval()
    rng = np.random.default_rng(0)
    src = [list(rng.integers(4, 8, int(n))) for n in rng.integers(3, 9, 12)]
    bos, eos = 2, 3
    found = translate_ids(model, src, bos, eos, DecodeOptions(beam=3, alpha=0.0, nbest=3, max_len_b=20))
    chosen = {}
    for alpha in ALPHAS:
        direct = translate_ids(model, src, bos, eos, DecodeOptions(beam=3, alpha=alpha, max_len_b=20))
        chosen[alpha] = best_under(found, alpha)
        assert chosen[alpha] == [hyps[0][0] for hyps in direct], alpha
    # not a vacuous check: the alphas do choose different hypotheses for some sentence
    assert len({tuple(map(tuple, c)) for c in chosen.values()}) > 1


@pytest.mark.parametrize("bleus, expected", [
    ({0.6: 20.0, 1.0: 21.5, 1.5: 21.0}, 1.0),
    ({0.3: 21.0, 0.6: 20.0, 1.0: 21.0}, 0.3),   # a tie: the nearer to the paper's 0.6
    ({0.0: 5.0, 0.6: 5.0, 2.0: 5.0}, 0.6),
])
def test_the_best_bleu_wins_and_a_tie_goes_to_the_papers_alpha(bleus, expected):
    by_alpha = {f"{a:g}": {"bleu": b} for a, b in bleus.items()}
    assert valid_choice.pick(by_alpha, list(bleus)) == expected


def test_a_choice_is_read_back_and_a_bad_file_is_none(tmp_path):
    choice = valid_choice.DecodingChoice(1.2, 4, 100, 3.5, {"1.2": {"bleu": 10.0, "bp": 0.99, "length_ratio": 0.99}})
    valid_choice.write_choice(tmp_path, choice)
    assert read_choice(tmp_path) == choice
    (tmp_path / run_file_names.DECODING).write_text("{not json")
    assert read_choice(tmp_path) is None
    assert read_choice(tmp_path / "elsewhere") is None
    assert run_folder_of(tmp_path / run_file_names.AVERAGED) == tmp_path
    assert run_folder_of(tmp_path / run_file_names.CHECKPOINTS / "step_0000006.npz") == tmp_path
    assert run_folder_of(tmp_path) == tmp_path


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned") / "run"
    assert train.main(copy_args(out, 6, "--tune-seconds", "0.1")) == 0
    return out


def test_train_py_chooses_alpha_on_valid_and_writes_it(tuned_run, capsys):
    choice = read_choice(tuned_run)
    assert choice is not None and choice.beam == 4 and choice.sentences >= valid_choice.CHUNK
    assert set(choice.by_alpha) == {f"{a:g}" for a in ALPHAS}
    best = max(v["bleu"] for v in choice.by_alpha.values())
    assert choice.by_alpha[f"{choice.alpha:g}"]["bleu"] == best
    settings = json.loads((tuned_run / run_file_names.DECODING).read_text())
    assert settings["alpha"] == choice.alpha


def test_a_short_run_keeps_the_papers_alpha_and_alpha_overrides(tmp_path, capsys):
    assert train.main(copy_args(tmp_path / "short", 3)) == 0  # 3 steps: far under a minute, nothing tuned
    assert not (tmp_path / "short" / run_file_names.DECODING).exists()
    assert train.main(copy_args(tmp_path / "given", 3, "--alpha", "1.0", "--tune-seconds", "5")) == 0
    assert not (tmp_path / "given" / run_file_names.DECODING).exists()  # --alpha given: nothing to choose


def test_translate_py_uses_the_runs_choice_unless_told(tuned_run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\n")
    choice = read_choice(tuned_run)
    assert translate.main(["--model", str(tuned_run), "--input", str(src), "--output", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert f"alpha {choice.alpha:g} (chosen on validation, {run_file_names.DECODING})" in err
    assert translate.main(["--model", str(tuned_run), "--input", str(src), "--output", str(tmp_path / "b"),
                           "--alpha", "1.7"]) == 0
    assert "alpha 1.7 (--alpha)" in capsys.readouterr().err


def test_the_short_hypotheses_report_is_a_beam_search_per_alpha(tuned_run, tmp_path, capsys):
    """bench/short_hypotheses.py's BLEU for alpha 0.6 and 1.2 is that of translating with that alpha."""
    import sacrebleu

    sys.path.insert(0, str(ROOT / "bench"))
    import short_hypotheses
    from numformer.checkpoint.trained_model import load_model
    from numformer.decoding.translation import translate_lines

    src, ref = ["a b c d", "e f g", "h i j k l"], ["a b c d", "e f g", "h i j k l"]
    (tmp_path / "s").write_text("\n".join(src) + "\n")
    (tmp_path / "r").write_text("\n".join(ref) + "\n")
    assert short_hypotheses.main(["--run", str(tuned_run), "--source", str(tmp_path / "s"), "--reference",
                                  str(tmp_path / "r"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model, vocab, _ = load_model(tuned_run)
    for alpha in (0.6, 1.2):
        hyps = translate_lines(model, vocab, src, DecodeOptions(beam=4, alpha=alpha))
        bleu = sacrebleu.corpus_bleu(hyps, [ref])
        row = report["by_alpha"][f"{alpha:g}"]
        # the same hypotheses: the same score and the same length (6 steps of training translate nothing well,
        # so the length is what tells two hypothesis sets apart here)
        assert row["bleu"] == round(bleu.score, 2) and row["length_ratio"] == round(bleu.sys_len / bleu.ref_len, 4)
    assert report["sentences"] == 3 and set(report["eos"]) == {
        "p_eos_at_reference_end", "p_eos_before_the_end", "sentences_with_eos_most_probable_before_the_end"}
