"""A user's Marian folder never gives a traceback: each file the import reads, damaged one way at a time, is
refused by ``python -m numformer.checkpoint import FOLDER --out OUT.npz`` (the real command, in a fresh process)
with exit status 2 and exactly one line on stderr naming the file, and the field where one is at fault; no
model file is written.

The damage is what a folder meets in practice: a field of the wrong type or out of range (a string where a
token id goes, ``"true"`` for true, a float size, a dropout of 1.5, a required size deleted), a file cut short,
JSON of the wrong top-level type, an empty file, random bytes, an empty map. The folder is the session's random
Marian model saved with ``save_pretrained`` (tests/interop/conftest.py): nothing downloads.
"""
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m numformer.checkpoint"


def set_field(name, value):
    def corrupt(path: Path):
        data = json.loads(path.read_text(encoding="utf-8"))
        data[name] = value
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return corrupt


def drop_field(name):
    def corrupt(path: Path):
        data = json.loads(path.read_text(encoding="utf-8"))
        del data[name]
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return corrupt


def truncated(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def top_level_list(path: Path):
    path.write_text("[1, 2, 3]\n", encoding="utf-8")


def emptied(path: Path):
    path.write_bytes(b"")


def random_bytes(path: Path):
    path.write_bytes(random.Random(path.name).randbytes(300))


def empty_object(path: Path):
    path.write_text("{}", encoding="utf-8")


# (file, how it is damaged, the field the message must name or None where the whole file is at fault)
CASES = {
    "config-decoder-start-string": ("config.json", set_field("decoder_start_token_id", "x"), "decoder_start_token_id"),
    "config-decoder-start-out-of-range": ("config.json", set_field("decoder_start_token_id", 9999),
                                          "decoder_start_token_id"),
    "config-pad-negative": ("config.json", set_field("pad_token_id", -1), "pad_token_id"),
    "config-eos-null": ("config.json", set_field("eos_token_id", None), "eos_token_id"),
    "config-vocab-size-string": ("config.json", set_field("vocab_size", "71"), "vocab_size"),
    "config-d-model-float": ("config.json", set_field("d_model", 16.5), "d_model"),
    "config-layers-missing": ("config.json", drop_field("encoder_layers"), "encoder_layers"),
    "config-scale-embedding-string": ("config.json", set_field("scale_embedding", "true"), "scale_embedding"),
    "config-dropout-out-of-range": ("config.json", set_field("dropout", 1.5), "dropout"),
    "config-activation-number": ("config.json", set_field("activation_function", 3), "activation_function"),
    "config-positions-bool": ("config.json", set_field("max_position_embeddings", True), "max_position_embeddings"),
    "config-truncated": ("config.json", truncated, None),
    "config-list": ("config.json", top_level_list, None),
    "config-empty": ("config.json", emptied, None),
    "config-random-bytes": ("config.json", random_bytes, None),
    "vocab-id-string": ("vocab.json", set_field("</s>", "x"), "the id of '</s>'"),
    "vocab-truncated": ("vocab.json", truncated, None),
    "vocab-list": ("vocab.json", top_level_list, None),
    "vocab-empty": ("vocab.json", emptied, None),
    "vocab-empty-object": ("vocab.json", empty_object, None),
    "vocab-random-bytes": ("vocab.json", random_bytes, None),
    "tokenizer-config-truncated": ("tokenizer_config.json", truncated, None),
    "tokenizer-config-list": ("tokenizer_config.json", top_level_list, None),
    "tokenizer-config-separate-vocabs-string": ("tokenizer_config.json", set_field("separate_vocabs", "no"),
                                                "separate_vocabs"),
    "tokenizer-config-eos-token-number": ("tokenizer_config.json", set_field("eos_token", 5), "eos_token"),
    "source-spm-random-bytes": ("source.spm", random_bytes, None),
    "source-spm-empty": ("source.spm", emptied, None),
    "target-spm-truncated": ("target.spm", truncated, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_is_one_line_naming_it_and_nothing_is_written(marian, tmp_path, case):
    name, corrupt, field = CASES[case]
    folder = tmp_path / "marian"
    shutil.copytree(marian("relu").folder, folder)
    corrupt(folder / name)
    out = tmp_path / "OUT.npz"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "numformer.checkpoint", "import", str(folder), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{PROG}: error: "), lines[0]
    named = f"{folder / name}: {field} " if field else str(folder / name)
    assert named in lines[0], (named, lines[0])
    assert not out.exists()
