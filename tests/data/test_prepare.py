"""Preparing a corpus once (numformer/data/prepared_dataset.py, the command numformer/prepare.py): the binary dataset, its reuse, re-preparation after a change,
the vocabulary's sample, errors with file and line, and two MPI ranks sharing one prepared dataset."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from support import ENV, mpirun
from numformer.data import DataError, SubwordVocab, read_lines
from numformer.data.encoding import CachedEncoder
from numformer.data.prepared_dataset import MANIFEST, prepare
from numformer.run_file_names import PREPARED

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("the a of and to in is was he for it with as his on be at by i this had not are but from or have an they "
         "which one you were her all she there would their we him been has when who will more no if out so said "
         "what up its about into than them can only other new some could time these two may then do first any my "
         "now such like our over man me even most made after also did many before must through back years where "
         "much your way well down should because each just those people how too little state good very make world "
         "still own see men work long get here between both life being under never day same another know while "
         "last might us great old year off come since against go came right used take three").split()


def write_corpus(folder, n_train=300, n_eval=20, seed=0):
    """A small corpus folder of random English-word sentences (target = source reversed)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        src = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 15)))) for _ in range(n)]
        (folder / f"{split}.src").write_text("".join(s + "\n" for s in src), encoding="utf-8")
        (folder / f"{split}.tgt").write_text("".join(" ".join(s.split()[::-1]) + "\n" for s in src),
                                             encoding="utf-8")
    return folder


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus")


def count_encodes(monkeypatch):
    calls = [0]
    real = CachedEncoder.encode

    def counting(self, lines):
        calls[0] += 1
        return real(self, lines)

    monkeypatch.setattr(CachedEncoder, "encode", counting)
    return calls


def test_preparation_writes_memory_mapped_ids_equal_to_sentencepiece(corpus, tmp_path):
    data = prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    assert not data.reused and (tmp_path / "run" / "spm.model").is_file()
    prep = tmp_path / "run" / PREPARED
    manifest = json.loads((prep / MANIFEST).read_text())
    assert manifest["pairs"] == {"train": 300, "valid": 20, "test": 20}
    assert manifest["vocab"]["size"] == data.vocab.size == 200
    for split in ("train", "valid", "test"):
        pairs = data.ids[split]
        assert isinstance(pairs.src_ids, np.memmap) and isinstance(pairs.tgt_offsets, np.memmap)
        assert pairs.src_ids.dtype == np.uint16  # 200 pieces fit 16 bits
        for side in ("src", "tgt"):
            expected = data.vocab.encode(read_lines(corpus / f"{split}.{side}"))
            assert pairs.side_lists(side) == expected, (split, side)
    assert data.text["valid"][0] == read_lines(corpus / "valid.src")
    assert "train" not in data.text  # the training text is not held


def test_a_second_preparation_reuses_the_files_without_encoding(corpus, tmp_path, monkeypatch):
    prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    prep = tmp_path / "run" / PREPARED
    stamps = {p.name: p.stat().st_mtime_ns for p in prep.iterdir()}
    calls = count_encodes(monkeypatch)
    again = prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    assert again.reused and calls[0] == 0
    assert {p.name: p.stat().st_mtime_ns for p in prep.iterdir()} == stamps
    assert again.vocab.size == 200 and len(again.ids["train"]) == 300


def test_a_changed_training_file_is_prepared_again_with_a_new_vocabulary(corpus, tmp_path, monkeypatch):
    first = prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    old_model = (tmp_path / "run" / "spm.model").read_bytes()
    with open(corpus / "train.src", "a", encoding="utf-8") as f:
        f.write("zebra quagga okapi\n")
    with open(corpus / "train.tgt", "a", encoding="utf-8") as f:
        f.write("okapi quagga zebra\n")
    calls = count_encodes(monkeypatch)
    second = prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    assert not second.reused and calls[0] > 0
    assert len(first.ids["train"]) == 300 and len(second.ids["train"]) == 301
    assert (tmp_path / "run" / "spm.model").read_bytes() != old_model  # trained on the new text
    assert second.ids["train"].side_lists("src")[-1] == second.vocab.encode(["zebra quagga okapi"])[0]


def test_a_changed_validation_file_is_encoded_again_with_the_same_vocabulary(corpus, tmp_path):
    prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    old_model = (tmp_path / "run" / "spm.model").read_bytes()
    (corpus / "valid.src").write_text("of the\n" * 20, encoding="utf-8")
    data = prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    assert not data.reused and (tmp_path / "run" / "spm.model").read_bytes() == old_model
    assert data.ids["valid"].side_lists("src")[0] == data.vocab.encode(["of the"])[0]


def test_another_vocabulary_size_is_prepared_again(corpus, tmp_path):
    assert prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1).vocab.size == 200
    data = prepare(tmp_path / "run", data_dir=corpus, vocab_size=240, seed=1)
    assert not data.reused and data.vocab.size == 240
    assert max(int(data.ids["train"].src_ids.max()), int(data.ids["train"].tgt_ids.max())) < 240
    assert prepare(tmp_path / "run", data_dir=corpus, seed=1).reused  # no size asked: the prepared one is fine


def test_a_run_with_checkpoints_keeps_its_vocabulary(corpus, tmp_path):
    run = tmp_path / "run"
    prepare(run, data_dir=corpus, vocab_size=200, seed=1)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_0000001.npz").write_bytes(b"x")
    with pytest.raises(DataError, match="leave --vocab-size out"):
        prepare(run, data_dir=corpus, vocab_size=240, seed=1)
    old_model = (run / "spm.model").read_bytes()
    with open(corpus / "train.src", "a", encoding="utf-8") as f:
        f.write("of the\n")
    with open(corpus / "train.tgt", "a", encoding="utf-8") as f:
        f.write("the of\n")
    data = prepare(run, data_dir=corpus, seed=1)  # text changed: encoded again, vocabulary kept
    assert not data.reused and len(data.ids["train"]) == 301 and (run / "spm.model").read_bytes() == old_model


def test_the_vocabulary_is_trained_on_a_sample_of_the_asked_size(corpus, tmp_path, monkeypatch):
    seen = []
    real = SubwordVocab.train.__func__

    def spy(cls, lines, *a, **k):
        lines = list(lines)
        seen.append(lines)
        return real(cls, lines, *a, **k)

    monkeypatch.setattr(SubwordVocab, "train", classmethod(spy))
    prepare(tmp_path / "a", data_dir=corpus, vocab_size=150, seed=1, vocab_sample=100)
    prepare(tmp_path / "b", data_dir=corpus, vocab_size=150, seed=1, vocab_sample=100)
    prepare(tmp_path / "c", data_dir=corpus, vocab_size=150, seed=2, vocab_sample=100)
    prepare(tmp_path / "d", data_dir=corpus, vocab_size=150, seed=1)
    src, tgt = read_lines(corpus / "train.src"), read_lines(corpus / "train.tgt")
    assert len(seen[0]) == 100 and seen[0] == seen[1] != seen[2]  # 50 pairs, drawn from the seed
    pairs = set(zip(src, tgt))
    assert all((s, t) in pairs for s, t in zip(seen[0][:50], seen[0][50:]))  # both sides of the same pairs
    assert seen[3] == src + tgt  # a corpus that fits the sample: every line, in file order


def test_a_bad_line_deep_in_a_file_is_reported_with_its_line_number(corpus, tmp_path, monkeypatch):
    import numformer.data.text_files as parallel

    monkeypatch.setattr(parallel.iter_line_blocks, "__defaults__", (64, True))  # many blocks
    lines = (corpus / "train.tgt").read_bytes().split(b"\n")
    lines[250] = b"caf\xe9 au lait"
    (corpus / "train.tgt").write_bytes(b"\n".join(lines))
    with pytest.raises(DataError, match=r"train\.tgt line 251 is not valid UTF-8"):
        prepare(tmp_path / "run", data_dir=corpus, vocab_size=200, seed=1)
    assert not (tmp_path / "run" / PREPARED / MANIFEST).exists()


def test_prepare_only_then_training_reuses_the_dataset(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--data", str(corpus), "--out", str(out), "--preset", "tiny", "--vocab-size", "200", "--no-progress"]
    assert train.main(flags + ["--prepare-only"]) == 0
    assert "prepared into" in capsys.readouterr().out and not (out / "checkpoints").exists()
    assert train.main(flags + ["--max-steps", "2", "--no-test", "--eval-every", "0", "--max-tokens", "400"]) == 0
    log = capsys.readouterr().out
    assert "memory-mapped from" in log and "prepared before" in log and "trained 2 steps" in log


def test_the_prepare_command_prepares_what_train_py_reuses(corpus, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "numformer.prepare", "--data", str(corpus), "--out", str(out), "--vocab-size", "200"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "prepared: data:" in proc.stdout, proc.stderr
    assert prepare(out, data_dir=corpus, seed=1).reused
    bad = subprocess.run(cmd[:4] + [str(tmp_path / "nowhere"), "--out", str(out)], capture_output=True, text=True,
                         cwd=ROOT)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "does not exist" in lines[0], bad.stderr


# -- two ranks ------------------------------------------------------------------------------------------------
def _two_rank_setup(corpus, tmp_path, *extra):

    report = tmp_path / ("report" + "".join(extra))
    report.mkdir()
    cmd = mpirun(2) + [sys.executable, str(ROOT / "tests" / "mpi_data_worker.py"), str(corpus), str(tmp_path / "run"),
                       str(report), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads((report / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_ranks_share_one_prepared_dataset(corpus, tmp_path):
    r0, r1 = _two_rank_setup(corpus, tmp_path)
    prepared = str((tmp_path / "run" / PREPARED / "train.src.ids.npy").resolve())
    assert r0["size"] == r1["size"] == 2
    assert r0["encoded_blocks"] > 0 and r1["encoded_blocks"] == 0  # rank 0 prepared, rank 1 only opened
    assert r0["memmap"] and r1["memmap"] and r0["file"] == r1["file"] == prepared
    assert r0["pairs"] == r1["pairs"] == 300
    assert r0["src"] == r1["src"] and r0["tgt_out"] == r1["tgt_out"]  # the same first batch on both
    # A second set-up reuses the preparation on both ranks.
    again = _two_rank_setup(corpus, tmp_path, "--again")
    assert [r["encoded_blocks"] for r in again] == [0, 0] and again[1]["file"] == prepared


def test_a_rank_without_the_files_gets_the_arrays_from_rank_zero(corpus, tmp_path):
    r0, r1 = _two_rank_setup(corpus, tmp_path, "--hide")
    assert r0["memmap"] and not r1["memmap"] and r1["encoded_blocks"] == 0
    assert r0["pairs"] == r1["pairs"] == 300 and r0["src"] == r1["src"] and r0["tgt_out"] == r1["tgt_out"]
