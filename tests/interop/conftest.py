"""Fixtures of tests/interop, built once per session and offline (tests/marian_files.py builds them): the
Marian tokenizer files, a random float64 MarianMTModel per activation saved as save_pretrained does and
imported into a numformer model file, and a small numformer model trained on the reverse task."""
import pytest

from marian_files import marian_config, random_marian, save_marian, train_reverse_apart, write_tokenizer_files


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian_tokenizer")
    write_tokenizer_files(folder)
    return folder


class MarianCase:
    """A saved random MarianMTModel (``hf``, in memory too) and its import (``npz``)."""

    def __init__(self, hf, folder, npz, vocab_size):
        self.hf, self.folder, self.npz, self.vocab_size = hf, folder, npz, vocab_size


@pytest.fixture(scope="session")
def marian(tmp_path_factory, tokenizer_dir):
    """``marian(activation)`` -> a :class:`MarianCase` (one per activation, built on first use)."""
    import json

    from numformer.checkpoint_command import main

    cases = {}

    def build(activation):
        if activation not in cases:
            root = tmp_path_factory.mktemp(f"marian_{activation}")
            size = len(json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8")))
            hf = random_marian(marian_config(size, activation), seed=len(cases))
            save_marian(hf, root / "hf", tokenizer_dir)
            assert main(["import", str(root / "hf"), "--out", str(root / "model.npz")]) == 0
            cases[activation] = MarianCase(hf, root / "hf", root / "model.npz", size)
        return cases[activation]

    return build


@pytest.fixture(scope="session")
def reverse_model(tmp_path_factory):
    """(model file, SubwordVocab, test source lines) of a numformer model trained 200 steps on reverse."""
    return train_reverse_apart(tmp_path_factory.mktemp("reverse"))


@pytest.fixture(autouse=True)
def one_torch_thread():
    """transformers' models here are tiny: one torch thread computes them faster than two waking each other
    (and than two fighting numpy's BLAS threads for the cores); restored after each test."""
    try:
        import torch
    except ImportError:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
