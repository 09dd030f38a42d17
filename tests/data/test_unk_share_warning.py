"""The <unk> share said in one warning line (numformer/data/unk_share.py): fine-tuning with a model's own
vocabulary (train.py --init-from: prepare's given_vocab) or translating (translate.py) text that vocabulary
does not cover warns once, with the share, the threshold, the file and what to do; covered text is quiet.
The model and its English-only vocabulary are made here (no byte fallback, as numformer trains them)."""
import pytest

import train
import translate
from numformer.checkpoint import save_checkpoint, vocab_fingerprint
from numformer.data import SubwordVocab, write_parallel_dir
from numformer.data.prepared_dataset import prepare
from numformer.data.unk_share import UNK_WARNING_SHARE, warn_unk_share
from numformer.model import Transformer
from numformer.presets import get_preset
from support import run_main

WORDS = "the a house tree river stone light water road bread field bird is was by of and in on".split()
ENGLISH = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 5)) for i in range(60)]
GREEK = ["Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν", "καὶ θεὸς ἦν ὁ λόγος", "οὗτος ἦν ἐν ἀρχῇ πρὸς τὸν θεόν",
         "πάντα δι᾽ αὐτοῦ ἐγένετο", "ἐν αὐτῷ ζωὴ ἦν"] * 4


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    """A run folder holding a random-weight model (1 layer, d_model 16) and its English-only vocabulary."""
    folder = tmp_path_factory.mktemp("english") / "run"
    vocab = SubwordVocab.train(ENGLISH, folder / "spm", 60)
    cfg = get_preset("tiny", vocab_size=vocab.size, d_model=16, d_ff=32, heads=2, layers=1, max_len=64)
    meta = {"model_config": cfg.to_dict(), "vocab_sha256": vocab_fingerprint(vocab), "step": 1}
    save_checkpoint(folder / "checkpoints" / "step_0000001.npz", Transformer(cfg, seed=0).state_dict(), meta)
    return folder


def corpus(folder, target):
    """English sources, ``target`` sentences as targets, in every split."""
    n = len(target) // 4
    return write_parallel_dir(folder, {"train": (ENGLISH[:2 * n], target[:2 * n]), "valid": (ENGLISH[:n], target[:n]),
                                       "test": (ENGLISH[:n], target[:n])})


def unk_lines(text):
    return [line for line in text.splitlines() if "<unk>" in line]


def test_fine_tuning_on_text_the_vocabulary_lacks_warns_once_naming_the_file(model_run, tmp_path):
    vocab = SubwordVocab.load(model_run / "spm.model")
    data_dir = corpus(tmp_path / "greek", GREEK)
    said = []
    prepare(tmp_path / "run", data_dir=data_dir, given_vocab=vocab, log=said.append)
    warnings = unk_lines("\n".join(said))
    assert len(warnings) == 1, said
    line = warnings[0]
    assert line.startswith("warning: <unk> is ") and f"of the tokens of {data_dir / 'train.tgt'}" in line
    assert f"above the {UNK_WARNING_SHARE:.0%} this warns at" in line and "leave out --init-from" in line
    assert "train.src" not in line  # the English side is covered


def test_fine_tuning_on_covered_text_says_nothing(model_run, tmp_path):
    vocab = SubwordVocab.load(model_run / "spm.model")
    said = []
    prepare(tmp_path / "run", data_dir=corpus(tmp_path / "english", ENGLISH[::-1]), given_vocab=vocab,
            log=said.append)
    assert unk_lines("\n".join(said)) == [] and said, said


def test_train_py_init_from_prints_the_warning(model_run, tmp_path, capsys):
    data_dir = corpus(tmp_path / "greek", GREEK)
    code, out, err = run_main(train.main, ["--init-from", str(model_run), "--data", str(data_dir), "--out",
                                           str(tmp_path / "tuned"), "--max-steps", "1", "--eval-every", "0",
                                           "--no-test", "--no-progress", "--max-tokens", "400"], capsys)
    assert code == 0, err
    warnings = unk_lines(out + err)
    assert len(warnings) == 1 and warnings[0].startswith("data: warning: <unk> is "), out + err
    assert str(data_dir / "train.tgt") in warnings[0]


@pytest.mark.parametrize("text, warned", [(GREEK[:5], True), (ENGLISH[:5], False)])
def test_translating_text_the_vocabulary_lacks_warns_once(model_run, tmp_path, capsys, text, warned):
    source = tmp_path / "input.txt"
    source.write_text("".join(line + "\n" for line in text), encoding="utf-8")
    code, out, err = run_main(translate.main, ["--model", str(model_run), "--input", str(source), "--greedy",
                                               "--max-len-a", "0", "--max-len-b", "3"], capsys)
    assert code == 0, err
    assert len(out.splitlines()) == len(text)
    warnings = unk_lines(err)
    if warned:
        assert len(warnings) == 1 and warnings[0].startswith("translate.py: warning: <unk> is "), err
        assert f"of the tokens of {source}" in warnings[0] and "use a model whose vocabulary covers" in warnings[0]
    else:
        assert warnings == [], err


def test_the_threshold_is_a_share_of_tokens():
    said = []
    below = [[5] * 98 + [1] * 2]   # 2%: at the threshold, quiet
    above = [[5] * 97 + [1] * 3]   # 3%
    assert warn_unk_share({"a.txt": below}, 1, said.append) is None and said == []
    line = warn_unk_share({"a.txt": below, "b.txt": above}, 1, said.append)
    assert said == [line] and line.startswith("warning: <unk> is 3.0% of the tokens of b.txt,") and "a.txt" not in line
