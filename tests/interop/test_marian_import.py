"""A Hugging Face Marian model imported into numformer computes what transformers computes: logits to 1e-10,
the loss and every gradient to 1e-9 (float64, label smoothing 0, pads ignored), for every activation_function
name of numformer's activations table (relu, swish, silu, gelu, ...), a
non-zero logits bias and encoder and decoder depths that differ, on a batch with padding whose decoder
starts from pad. transformers' autograd is a third, independent check of numformer's hand-written backward
(after finite differences and the PyTorch mirror), on a peer's implementation of the same model.

A planted wrong permutation (the identity), a dropped logits bias and a pad row that takes gradient from
its lookups each fail the comparison by far. Bad input to ``python -m numformer.checkpoint import`` is one
line, exit 2, nothing written. Nothing downloads: the Hub case runs offline and must fail so."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from numformer.activations import from_transformers, transformers_names  # noqa: E402
from numformer.checkpoint import load_checkpoint  # noqa: E402
from numformer.checkpoint_command import main  # noqa: E402
from numformer.interop.marian import marian_permutation, marian_to_numformer  # noqa: E402
from numformer.loss import LabelSmoothedCrossEntropy  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.presets import ModelConfig  # noqa: E402
from support import assert_one_line_error, run_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m numformer.checkpoint"
LOGITS_TOL, GRAD_TOL = 1e-10, 1e-9
# dL/d(key bias) is exactly zero (q . b_k shifts a query's scores alike; softmax ignores it): both sides
# give round-off, bounded relative to the key projection's weight gradient (tests/checks/test_torch_parity.py)
ZERO_GRAD_SUFFIX, ZERO_ATOL = "w_k.bias", 1e-12


def batch(vocab_size, seed=0):
    """(src, tgt_in, tgt_out) with padding: Marian's pad is V-1, its eos 0, the decoder starts from pad."""
    pad, eos = vocab_size - 1, 0
    rng = np.random.default_rng(seed)
    src_len, tgt_len = [7, 4, 2], [5, 6, 1]
    src = np.full((3, 8), pad)
    tgt_in, tgt_out = np.full((3, 7), pad), np.full((3, 7), pad)
    for i, (s, t) in enumerate(zip(src_len, tgt_len)):
        src[i, :s], src[i, s] = rng.integers(2, pad, s), eos
        y = rng.integers(2, pad, t)
        tgt_in[i, 0], tgt_in[i, 1:t + 1] = pad, y
        tgt_out[i, :t], tgt_out[i, t] = y, eos
    return src, tgt_in, tgt_out


def numformer_run(case, state=None, **changes):
    """numformer in float64 on the imported file (``state`` in its place when given): logits, loss, gradients."""
    ck = load_checkpoint(case.npz)
    cfg = ModelConfig.from_dict(ck.meta["model_config"]).replace(dropout=0.0, attn_dropout=0.0, relu_dropout=0.0,
                                                                  **changes)
    model = Transformer(cfg, seed=0, dtype=np.float64)
    model.load_state_dict(state if state is not None else ck.model)
    model.train()
    model.zero_grad()
    src, tgt_in, tgt_out = batch(case.vocab_size)
    logits = model.forward(src, tgt_in)
    crit = LabelSmoothedCrossEntropy(0.0, cfg.pad_id)
    loss = float(crit.forward(logits, tgt_out))
    logits = np.array(logits)
    model.backward(crit.backward())
    return logits, loss, {n: p.grad.copy() for n, p in model.named_parameters()}


def transformers_run(case):
    """transformers in float64 on the same batch: logits, CrossEntropyLoss(ignore_index=pad), autograd gradients
    mapped to numformer's names and layout through the importer's own mapping."""
    hf = case.hf
    hf.zero_grad()
    pad = case.vocab_size - 1
    src, tgt_in, tgt_out = (torch.from_numpy(a) for a in batch(case.vocab_size))
    dec_mask = tgt_in != pad
    dec_mask[:, 0] = True  # the start token is pad: numformer never masks position 0, transformers is told so
    out = hf(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in, decoder_attention_mask=dec_mask)
    loss = torch.nn.CrossEntropyLoss(ignore_index=pad)(out.logits.reshape(-1, case.vocab_size), tgt_out.reshape(-1))
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in hf.named_parameters() if p.grad is not None}
    cfg = hf.config
    mapped = marian_to_numformer(grads, cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, strict=False)
    return out.logits.detach().numpy(), float(loss.detach()), mapped


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


@pytest.mark.parametrize("activation", transformers_names())  # relu, swish, silu, gelu, ...: the table's
def test_logits_loss_and_every_gradient_equal_transformers(marian, activation):
    case = marian(activation)
    cfg = ModelConfig.from_dict(load_checkpoint(case.npz).meta["model_config"])
    assert cfg.activation == from_transformers(activation).name
    logits, loss, grads = numformer_run(case)
    t_logits, t_loss, t_grads = transformers_run(case)
    assert np.abs(logits - t_logits).max() <= LOGITS_TOL, np.abs(logits - t_logits).max()
    assert abs(loss - t_loss) <= GRAD_TOL * abs(t_loss)
    assert set(grads) == set(t_grads), set(grads) ^ set(t_grads)   # every parameter, the tied embedding once
    worst = {}
    for name, g in grads.items():
        if name.endswith(ZERO_GRAD_SUFFIX):
            bound = ZERO_ATOL * max(1.0, np.linalg.norm(grads[name.replace("bias", "weight")]))
            assert np.linalg.norm(g) <= bound and np.linalg.norm(t_grads[name]) <= bound, name
            continue
        worst[name] = rel(g, t_grads[name])
    bad = {n: e for n, e in worst.items() if e > GRAD_TOL}
    assert not bad, bad
    print(f"\n{activation}: logits {np.abs(logits - t_logits).max():.1e}, worst gradient {max(worst.values()):.1e} "
          f"({max(worst, key=worst.get)}) over {len(worst)} tensors")


def test_the_pad_row_gets_gradient_from_the_output_projection_only(marian):
    """The decoder starts from pad, a real lookup: the row's gradient is the projection's alone (padding_idx)."""
    case = marian("relu")
    _, _, grads = numformer_run(case)
    _, _, with_lookups = numformer_run(case, pad_row_gradient=True)
    pad = case.vocab_size - 1
    assert np.abs(grads["src_embed.weight"][pad]).max() > 0   # the output projection's part
    error = rel(with_lookups["src_embed.weight"][pad], grads["src_embed.weight"][pad])
    print(f"\npad row with lookup gradient: its gradient off by {error:.2e} (relative)")
    assert error > 1e-2
    others = [np.delete(g["src_embed.weight"], pad, 0) for g in (with_lookups, grads)]
    assert np.array_equal(*others)   # every other row alike


# -- planted bugs: each must fail the comparison by far --------------------------------------------------------
def _state_with(case, permutation=None, drop_bias=False):
    from safetensors.numpy import load_file

    hf_state = load_file(str(case.folder / "model.safetensors"))
    cfg = case.hf.config
    state = marian_to_numformer(hf_state, cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, permutation)
    if drop_bias:
        state["final_logits_bias"] = np.zeros_like(state["final_logits_bias"])
    return state


def test_planted_identity_permutation_fails(marian):
    case = marian("swish")
    assert not np.array_equal(marian_permutation(16), np.arange(16))
    logits, _, grads = numformer_run(case, _state_with(case, permutation=np.arange(16)))
    t_logits, _, t_grads = transformers_run(case)
    error = np.abs(logits - t_logits).max()
    print(f"\nidentity permutation: logits off by {error:.2e}")
    assert error > 1e-2
    assert rel(grads["encoder.layers.0.ffn.w_1.weight"], t_grads["encoder.layers.0.ffn.w_1.weight"]) > 1e-2


def test_planted_dropped_logits_bias_fails(marian):
    case = marian("swish")
    logits, loss, _ = numformer_run(case, _state_with(case, drop_bias=True))
    t_logits, t_loss, _ = transformers_run(case)
    error = np.abs(logits - t_logits).max()
    print(f"\ndropped logits bias: logits off by {error:.2e}, loss {loss:.4f} against {t_loss:.4f}")
    assert error > 1e-1 and abs(loss - t_loss) > 1e-3


def test_import_keeps_the_weights_exactly(marian):
    """Permuting and transposing move numbers, never round them: the file holds Marian's float64 values."""
    case = marian("relu")
    ck = load_checkpoint(case.npz)
    shared = case.hf.model.shared.weight.detach().numpy()
    assert ck.model["src_embed.weight"].dtype == np.float64
    assert np.array_equal(ck.model["src_embed.weight"][:, marian_permutation(16)], shared)
    assert np.array_equal(ck.model["final_logits_bias"], case.hf.final_logits_bias.numpy()[0])
    cfg = ModelConfig.from_dict(ck.meta["model_config"])
    assert (cfg.layers, cfg.n_decoder_layers, cfg.activation, cfg.logits_bias, cfg.pad_row_gradient, cfg.pad_id,
            cfg.dropout) == (2, 3, "relu", True, False, case.vocab_size - 1, 0.1)
    assert ModelConfig.from_dict(load_checkpoint(marian("swish").npz).meta["model_config"]).activation == "silu"


# -- one-line errors: exit 2, nothing written -----------------------------------------------------------------
def _variant(case, tmp_path, config=None, drop=(), files=None):
    folder = tmp_path / "variant"
    shutil.copytree(case.folder, folder)
    if config:
        c = json.loads((folder / "config.json").read_text())
        c.update(config)
        (folder / "config.json").write_text(json.dumps(c))
    for name in drop:
        (folder / name).unlink()
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


BAD_CONFIGS = {
    "bart": ({"model_type": "bart"}, "model_type 'bart'"),
    "t5": ({"model_type": "t5"}, "model_type 't5'"),
    "quick-gelu": ({"activation_function": "quick_gelu"}, "activation_function 'quick_gelu'"),
    "untied": ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings false"),
    "lm-head": ({"tie_word_embeddings": False}, "tie_word_embeddings false"),
    "no-scale": ({"scale_embedding": False}, "scale_embedding false"),
    "pre-LN": ({"normalize_before": True}, "normalize_before true"),
    "embedding-LN": ({"normalize_embedding": True}, "normalize_embedding true"),
    "final-LN": ({"add_final_layer_norm": True}, "add_final_layer_norm true"),
    "heads": ({"decoder_attention_heads": 4}, "decoder_attention_heads 4"),
}


@pytest.mark.parametrize("kind", list(BAD_CONFIGS))
def test_a_model_numformer_cannot_represent_is_one_line(marian, tmp_path, capsys, kind):
    change, needle = BAD_CONFIGS[kind]
    folder = _variant(marian("relu"), tmp_path, config=change)
    code, _, err = run_main(main, ["import", str(folder), "--out", str(tmp_path / "m.npz")], capsys)
    assert_one_line_error(code, err, PROG, needle)
    assert not (tmp_path / "m.npz").exists()


@pytest.mark.parametrize("drop,needle", [(("target.spm",), "target.spm"), (("vocab.json", "source.spm"),
                                                                              "source.spm, vocab.json"),
                                         (("config.json",), "no config.json"),
                                         (("model.safetensors",), "holds no weights")])
def test_missing_files_are_one_line(marian, tmp_path, capsys, drop, needle):
    folder = _variant(marian("relu"), tmp_path, drop=drop)
    code, _, err = run_main(main, ["import", str(folder), "--out", str(tmp_path / "m.npz")], capsys)
    assert_one_line_error(code, err, PROG, needle)
    assert not (tmp_path / "m.npz").exists()


def test_a_vocabulary_of_another_size_is_one_line(marian, tmp_path, capsys):
    case = marian("relu")
    pieces = json.loads((case.folder / "vocab.json").read_text())
    del pieces[next(p for p in pieces if p.startswith("\u2581"))]   # one piece fewer than the embedding's rows
    folder = _variant(case, tmp_path, files={"vocab.json": json.dumps(pieces)})
    code, _, err = run_main(main, ["import", str(folder), "--out", str(tmp_path / "m.npz")], capsys)
    assert_one_line_error(code, err, PROG, f"vocab.json has {case.vocab_size - 1} pieces")
    assert not (tmp_path / "m.npz").exists()


def test_paths_that_are_not_a_model_folder_are_one_line(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    for source, needle in ((tmp_path / "file.txt", "is a text file, not a Hugging Face Marian model"),
                           ("./no/such/folder", "does not exist")):
        code, _, err = run_main(main, ["import", str(source), "--out", str(tmp_path / "m.npz")], capsys)
        assert_one_line_error(code, err, PROG, needle)
    assert not (tmp_path / "m.npz").exists()


def test_a_hub_id_without_network_is_one_line(tmp_path):
    """The real command in a fresh process, offline (HF_HUB_OFFLINE, an empty cache): nothing is fetched."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "numformer.checkpoint", "import", "Helsinki-NLP/opus-mt-en-de",
                           "--out", str(tmp_path / "m.npz")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert_one_line_error(proc.returncode, proc.stderr, PROG, "fetching it from the Hugging Face Hub failed")
    assert "no network" in proc.stderr
    assert not (tmp_path / "m.npz").exists()


def test_numformer_imports_the_interop_packages_only_inside_functions():
    """The core never needs transformers, huggingface_hub or torch: no module imports them at its top level
    (they are imported where a Marian folder is fetched or a PyTorch pickle read)."""
    import ast

    outside = ("transformers", "huggingface_hub", "torch")
    offenders = []
    for path in sorted((ROOT / "numformer").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in outside]
    assert not offenders, offenders


def _same_model(path_a, path_b):
    a, b = load_checkpoint(path_a), load_checkpoint(path_b)
    assert a.model.keys() == b.model.keys() and a.vocab == b.vocab
    for name in a.model:
        assert np.array_equal(a.model[name], b.model[name]), name


def test_a_hub_id_is_fetched_through_snapshot_download(marian, tmp_path, monkeypatch, capsys):
    """The Hub path with snapshot_download standing in for the network: safetensors, config and tokenizer
    files are asked for, the PyTorch pickle is not (it is only when a repository has no safetensors)."""
    import huggingface_hub

    from numformer.interop.marian import HUB_PATTERNS

    case, calls = marian("relu"), []

    def snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, list(allow_patterns)))
        return str(case.folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    code, _, err = run_main(main, ["import", "Helsinki-NLP/opus-mt-xx-yy", "--out", str(tmp_path / "m.npz")], capsys)
    assert code == 0, err
    assert calls == [("Helsinki-NLP/opus-mt-xx-yy", HUB_PATTERNS)] and "pytorch_model.bin" not in HUB_PATTERNS
    _same_model(tmp_path / "m.npz", case.npz)


def test_a_pytorch_pickle_with_its_tied_copies_and_positions_imports_alike(marian, tmp_path, capsys):
    """Older opus-mt files are a pytorch_model.bin of the whole state dict: the tied embedding under four
    names and both positional tables (checked to be Marian's sinusoids, then dropped)."""
    case = marian("relu")
    folder = _variant(case, tmp_path, drop=("model.safetensors",))
    state = case.hf.state_dict()
    assert {"lm_head.weight", "model.encoder.embed_positions.weight"} <= set(state)
    torch.save(state, folder / "pytorch_model.bin")
    code, _, err = run_main(main, ["import", str(folder), "--out", str(tmp_path / "m.npz")], capsys)
    assert code == 0, err
    _same_model(tmp_path / "m.npz", case.npz)
    with torch.no_grad():
        state["model.decoder.embed_positions.weight"][3] += 1.0   # not the sinusoids
    torch.save(state, folder / "pytorch_model.bin")
    code, _, err = run_main(main, ["import", str(folder), "--out", str(tmp_path / "m2.npz")], capsys)
    assert_one_line_error(code, err, PROG, "is not Marian's sinusoid table")
    assert not (tmp_path / "m2.npz").exists()
