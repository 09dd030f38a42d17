"""Hugging Face Marian models and numformer models built offline, for tests/interop (nothing downloads).

* :func:`write_tokenizer_files`: two small sentencepiece models trained here on synthetic sentences (an
  English-like source side, a German-like target side) and a joint ``vocab.json`` in Marian's order
  (``</s>`` 0, ``<unk>`` 1, the pieces of both models, ``<pad>`` last), with a few source pieces left out
  of the map so that they become ``<unk>``, as MarianTokenizer does;
* :func:`random_marian`: a float64 ``MarianMTModel`` of a small ``MarianConfig`` with random weights and a
  random (non-zero) ``final_logits_bias``, different encoder and decoder depths; :func:`save_marian`
  writes it with its tokenizer as ``save_pretrained`` does;
* :func:`exact_positions`: transformers builds Marian's sinusoid table through ``torch.FloatTensor``,
  float32, whatever the model's dtype (``MarianSinusoidalPositionalEmbedding.create_weight``); the
  float64 comparisons put the same formula in float64 in its place, so that they measure the mapping
  and not the table's rounding (3e-8, which alone moves the logits by ~1e-10);
* :func:`train_reverse`: a numformer model of a few thousand weights trained a few hundred steps on the
  reverse task, for the greedy-decoding comparison (:func:`train_reverse_apart`: in a child process with
  one BLAS thread).
"""
import io
import json
import random

import numpy as np

SRC_WORDS = ["the", "cat", "dog", "sat", "on", "mat", "house", "green", "tree", "runs", "quickly", "and", "under",
             "big", "small", "red", "river", "over", "bridge", "walks"]
TGT_WORDS = ["der", "hund", "katze", "saß", "auf", "matte", "haus", "grün", "baum", "läuft", "schnell", "und",
             "unter", "groß", "klein", "rot", "fluss", "über", "brücke", "geht"]
#: Source pieces left out of vocab.json (MarianTokenizer maps them to <unk>).
DROPPED = ("▁bridge", "▁walks")


def sentences(words, seed: int, n: int = 300) -> list:
    r = random.Random(seed)
    return [" ".join(r.choice(words) for _ in range(r.randint(3, 9))) + r.choice([".", "!", "?", ""])
            for _ in range(n)]


def train_spm(lines, size: int) -> bytes:
    """A unigram sentencepiece model (sentencepiece's default special pieces: <unk> 0, <s> 1, </s> 2), in memory."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=size,
                                   model_type="unigram", character_coverage=1.0, num_threads=1, minloglevel=2,
                                   hard_vocab_limit=False, seed_sentencepiece_size=10000)
    return out.getvalue()


def write_tokenizer_files(folder) -> dict:
    """source.spm, target.spm and vocab.json in ``folder``; returns the map (piece -> id)."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    protos = [train_spm(sentences(SRC_WORDS, 1), 70), train_spm(sentences(TGT_WORDS, 2), 80)]
    (folder / "source.spm").write_bytes(protos[0])
    (folder / "target.spm").write_bytes(protos[1])
    order = ["</s>", "<unk>"]
    for proto in protos:
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(proto)
        order += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                  if sp.id_to_piece(i) not in ("<unk>", "<s>", "</s>") + DROPPED]
    pieces = {}
    for piece in order:
        pieces.setdefault(piece, len(pieces))
    pieces["<pad>"] = len(pieces)
    (folder / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
    return pieces


def marian_config(vocab_size: int, activation: str = "swish", **changes):
    from transformers import MarianConfig

    settings = dict(vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=16, encoder_layers=2,
                    decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                    decoder_ffn_dim=32, max_position_embeddings=64, activation_function=activation,
                    scale_embedding=True, pad_token_id=vocab_size - 1, eos_token_id=0,
                    decoder_start_token_id=vocab_size - 1, forced_eos_token_id=0, dropout=0.1, attention_dropout=0.0,
                    activation_dropout=0.0, share_encoder_decoder_embeddings=True)
    settings.update(changes)
    return MarianConfig(**settings)


def exact_positions(model) -> None:
    """Marian's sinusoid table in float64 in place of transformers' float32-rounded one (see the module)."""
    import torch

    from numformer.interop.marian import marian_sinusoids

    with torch.no_grad():
        for stack in (model.model.encoder, model.model.decoder):
            table = stack.embed_positions.weight
            table.copy_(torch.from_numpy(marian_sinusoids(table.shape[0], table.shape[1])))


def random_marian(config, seed: int = 0):
    """A float64 MarianMTModel with random weights (LayerNorm gains around 1) and a random logits bias."""
    import torch
    from transformers import MarianMTModel

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = MarianMTModel(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3
            p.copy_(1.0 + noise if "layer_norm.weight" in name else noise)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=g, dtype=torch.float64))
    exact_positions(model)
    return model


def save_marian(model, folder, tokenizer_folder) -> None:
    """``model.save_pretrained`` plus the tokenizer files, completed by MarianTokenizer.save_pretrained."""
    import shutil

    from transformers import MarianTokenizer

    model.save_pretrained(folder)
    for name in ("source.spm", "target.spm", "vocab.json"):
        shutil.copy(tokenizer_folder / name, folder / name)
    MarianTokenizer.from_pretrained(str(folder)).save_pretrained(str(folder))


def train_reverse(folder, steps: int = 200, seed: int = 0, batch_size: int = 48):
    """(model file, vocabulary, test source lines): a numformer model (d_model 32, 2 encoder + 1 decoder layers)
    trained ``steps`` Adam steps of ``batch_size`` pairs on the reverse task, saved with its vocabulary in one file."""
    from numformer.checkpoint import save_checkpoint, vocab_fingerprint
    from numformer.data import SubwordVocab, TokenPairs, make_synthetic
    from numformer.loss import LabelSmoothedCrossEntropy
    from numformer.model import Transformer
    from numformer.optim import Adam
    from numformer.presets import ModelConfig

    data = make_synthetic("reverse", 3000, 0, 50, seed=seed, vocab=tuple("abcdefghijkl"), min_len=2, max_len=7)
    src, tgt = data["train"]
    vocab = SubwordVocab.train(src + tgt, folder / "spm", 24)
    pairs = TokenPairs.from_lists(vocab.encode(src), vocab.encode(tgt))
    cfg = ModelConfig(vocab_size=vocab.size, d_model=32, d_ff=64, heads=4, layers=2, decoder_layers=1, dropout=0.0,
                      label_smoothing=0.0, max_len=64, pad_id=vocab.pad_id).checked()
    model = Transformer(cfg, seed=seed, dtype=np.float32)
    crit = LabelSmoothedCrossEntropy(0.0, vocab.pad_id)
    opt = Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    model.train()
    for _ in range(steps):
        batch = pairs.batch(rng.choice(len(pairs), batch_size, replace=False), vocab.pad_id, vocab.bos_id, vocab.eos_id)
        loss = crit.forward(model.forward(batch.src, batch.tgt_in), batch.tgt_out)
        model.backward(crit.backward())
        opt.step(zero_grad=True)
    meta = {"model_config": cfg.to_dict(), "vocab_size": vocab.size, "vocab_sha256": vocab_fingerprint(vocab),
            "step": steps, "final_loss": float(loss)}
    path = folder / "reverse.npz"
    save_checkpoint(path, model.state_dict(), meta, vocab=vocab.to_bytes())
    (folder / "test.src").write_text("\n".join(data["test"][0]) + "\n", encoding="utf-8")
    return path, vocab, data["test"][0]


def train_reverse_apart(folder):
    """:func:`train_reverse` in a child process with one BLAS thread and one numformer thread: its GEMMs are
    tiny, and OpenBLAS's two threads waking each other for every one of them on a busy 2-core machine
    made the same training take 10 to 30 times longer (measured 2 s against 29-62 s)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from numformer.data import SubwordVocab

    tests = Path(__file__).resolve().parent
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", NUMFORMER_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")]))
    code = f"from pathlib import Path; from marian_files import train_reverse; train_reverse(Path({str(folder)!r}))"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    lines = (folder / "test.src").read_text(encoding="utf-8").splitlines()
    return folder / "reverse.npz", SubwordVocab.load(folder / "spm.model"), lines


def fine_tune_args(npz, data, out, steps) -> list:
    """train.py's arguments for ``steps`` steps of fine-tuning ``npz`` on ``data`` as one batch a step: no dropout,
    no label smoothing, every step logged and saved, no test."""
    return ["--init-from", str(npz), "--data", str(data), "--preset", "tiny", "--max-steps", str(steps),
            "--max-tokens", "100000", "--accum", "1", "--dropout", "0", "--label-smoothing", "0", "--log-every", "1",
            "--eval-every", "0", "--save-every", "1", "--average-last", "1", "--no-test", "--no-progress", "--out",
            str(out)]
