"""The paper's experiment in one command, end to end on fixtures shaped like its two sources (a datasets
wmt14 dataset saved locally, a --wmt-dir tree of text files): prepare -> train a few accumulated steps
-> average -> decode newstest2014 -> sacreBLEU and the paper-comparable BLEU, printed and saved; and the
one-line refusals (no network and no --wmt-dir, --wmt-dir on another corpus, translate.py --bleu paper)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import train
import translate
from support import assert_one_line_error, run_main, save_wmt14_dataset

ROOT = Path(__file__).resolve().parents[2]
WORDS = [("the", "die"), ("house", "Haus"), ("is", "ist"), ("big", "groß"), ("science-fiction", "Science-Fiction"),
         ("book", "Buch"), ("we", "wir"), ("read", "lesen"), ("world", "Welt"), ("peace", "Frieden")]


def sentences(n, seed):
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS)) for _ in range(rng.randint(3, 9))]
        pairs.append((" ".join(WORDS[i][0] for i in idx), " ".join(WORDS[i][1] for i in idx)))
    return pairs


SPLITS = {"train": sentences(300, 1), "validation": sentences(20, 2), "test": sentences(24, 3)}
STEMS = {"train": "train", "validation": "newstest2013", "test": "newstest2014"}


def text_tree(folder):
    folder.mkdir()
    for split, pairs in SPLITS.items():
        (folder / f"{STEMS[split]}.en").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (folder / f"{STEMS[split]}.de").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return folder


@pytest.mark.parametrize("source", ["datasets", "text"])
def test_the_whole_path_prints_and_saves_both_bleus(tmp_path, monkeypatch, capsys, source):
    pytest.importorskip("sacremoses")
    monkeypatch.setenv("NUMFORMER_CACHE", str(tmp_path / "cache"))
    wmt = save_wmt14_dataset(tmp_path / "wmt", SPLITS) if source == "datasets" else text_tree(tmp_path / "wmt")
    out = tmp_path / "run"
    code, stdout, err = run_main(train.main, [
        "--corpus", "wmt14-en-de", "--wmt-dir", str(wmt), "--preset", "tiny", "--max-steps", "6",
        "--max-tokens", "300", "--step-tokens", "900", "--save-every", "2", "--keep-last", "3", "--average-last", "3",
        "--eval-every", "0", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert "300 tokens x 3 per step (the recipe's ~900 source + target tokens a step)" in stdout
    forecast = next(line for line in stdout.splitlines() if line.startswith("tiny on this device (cpu): ~"))
    assert " for 6 steps (" in forecast and "over steps 2-6;" in forecast and "in 3 accumulated batches" in forecast
    assert "averaged the last 3 checkpoints" in stdout
    scores = json.loads((out / "test_scores.json").read_text())
    assert scores["sentences"] == len(SPLITS["test"]) and scores["steps"] == 6
    assert "tok:13a" in scores["bleu_signature"] and "##AT##" in scores["bleu_paper_method"]
    assert len(scores["bleu_paper_counts"]) == 4 and scores["bleu_paper_totals"][0] > 0
    assert f"test: BLEU {scores['bleu']:.2f}  chrF" in stdout
    assert f"test: BLEU {scores['bleu_paper']:.2f} paper-comparable (" in stdout
    assert "compares with the paper-comparable BLEU, not with sacreBLEU's" in stdout
    hyps = (out / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(SPLITS["test"])
    # the same evaluation as a command for the hypothesis file
    ref = tmp_path / "newstest2014.de"
    ref.write_text("".join(t + "\n" for _, t in SPLITS["test"]), encoding="utf-8")
    code, _, err = run_main(translate.main, ["--hypotheses", str(out / "test.hyp"), "--reference", str(ref),
                                             "--bleu", "paper", "--target-lang", "de"], capsys)
    assert code == 0 and f"BLEU {scores['bleu_paper']:.2f}  (paper-comparable:" in err


def test_no_network_and_no_wmt_dir_is_one_line_and_writes_nothing(tmp_path):
    pytest.importorskip("datasets")
    env = {"NUMFORMER_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "train.py"), "--corpus", "wmt14-en-fr", "--out",
                           str(tmp_path / "run"), "--max-steps", "1", "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert_one_line_error(done.returncode, done.stderr, "train.py", "cannot get WMT 2014 fr-en (wmt/wmt14)")
    assert "no network" in done.stderr and "--wmt-dir DIR" in done.stderr
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert not (tmp_path / "run" / "prepared").exists()


def test_wmt_dir_with_another_corpus_and_bleu_paper_without_a_language(tmp_path, capsys):
    code, _, err = run_main(train.main, ["--corpus", "bible-en-es", "--wmt-dir", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "train.py", "--wmt-dir gives the files of a WMT 2014 corpus")
    code, _, err = run_main(translate.main, ["--hypotheses", "h", "--reference", "r", "--bleu", "paper"], capsys)
    assert_one_line_error(code, err, "translate.py", "--target-lang")
