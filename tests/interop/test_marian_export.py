"""``python -m numformer.checkpoint export RUN --format hf`` writes a folder transformers loads and computes
numformer's model with: the same logits (float64, 1e-10), MarianTokenizer's ids equal to numformer's
vocabulary's, and ``generate``'s greedy outputs equal to numformer's greedy search on 50 sentences of a small
trained model (the main job's model, by hand: ``bench/transformers_agreement.py``, docs/interop.md).
Round trips: Marian -> numformer -> Marian gives back identical arrays and tokenizer files, and an imported
Marian model decodes greedily in numformer (starting from pad) as transformers decodes it. Refusals (pre-LN,
learned positions, an output folder in the way) are one line, exit 2, nothing written."""
import json

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from transformers import MarianMTModel, MarianTokenizer  # noqa: E402

from marian_files import SRC_WORDS, exact_positions, sentences  # noqa: E402
from numformer.activations import from_transformers, transformers_names  # noqa: E402
from numformer.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from numformer.checkpoint_command import main  # noqa: E402
from numformer.data.marian_vocab import vocab_from_bytes  # noqa: E402
from numformer.decoding.translation import DecodeOptions, translate_ids, translate_lines  # noqa: E402
from numformer.model import Transformer  # noqa: E402
from numformer.presets import ModelConfig  # noqa: E402
from support import assert_one_line_error, run_main  # noqa: E402

PROG = "python -m numformer.checkpoint"
MAX_NEW = 12  # output budget of both searches: at most 12 tokens, eos forced at the 12th


def numformer_float64(path):
    """(model in eval mode, float64, vocabulary) from a numformer model file."""
    ck = load_checkpoint(path)
    model = Transformer(ModelConfig.from_dict(ck.meta["model_config"]), seed=0, dtype=np.float64)
    model.load_state_dict(ck.model)
    return model.eval(), vocab_from_bytes(ck.vocab)


def export(source, out, capsys):
    code, _, err = run_main(main, ["export", str(source), "--format", "hf", "--out", str(out)], capsys)
    assert code == 0, err
    return out


def hf_float64(folder):
    model = MarianMTModel.from_pretrained(str(folder), dtype=torch.float64, attn_implementation="eager").eval()
    exact_positions(model)   # transformers' table is float32-rounded (tests/marian_files.py)
    return model


def greedy_both(model, vocab, hf, tok, lines, **generate):
    """Greedy outputs of numformer (token ids and text) and of transformers' generate, for ``lines``."""
    opts = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=MAX_NEW)
    ours = translate_lines(model, vocab, lines, opts)
    ours_ids = [hyps[0][0] for hyps in translate_ids(model, vocab.encode_source(lines), vocab.bos_id, vocab.eos_id,
                                                     opts)]
    enc = tok(lines, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW, **generate).numpy()
    theirs_ids = []
    for row in out[:, 1:].tolist():                       # the start token, then the output
        theirs_ids.append(row[: row.index(vocab.eos_id)] if vocab.eos_id in row else row)
    assert (out[:, 0] == vocab.bos_id).all()
    return ours, ours_ids, tok.batch_decode(out, skip_special_tokens=True), theirs_ids


# -- a numformer model out to transformers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(reverse_model, tmp_path_factory):
    path, vocab, lines = reverse_model
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", str(path), "--format", "hf", "--out", str(out)]) == 0
    return path, vocab, lines, out


def test_transformers_computes_the_exported_model(exported):
    path, vocab, lines, folder = exported
    model, _ = numformer_float64(path)
    hf = hf_float64(folder)
    config = json.loads((folder / "config.json").read_text())
    assert (config["pad_token_id"], config["eos_token_id"], config["decoder_start_token_id"]) == (0, 3, 2)
    assert (config["encoder_layers"], config["decoder_layers"], config["activation_function"]) == (2, 1, "relu")
    src = [vocab.encode_source([s])[0] + [vocab.eos_id] for s in lines[:4]]
    tgt = [[vocab.bos_id] + vocab.encode_target([s])[0] for s in lines[4:8]]
    pad = lambda rows: np.array([r + [vocab.pad_id] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    src, tgt = pad(src), pad(tgt)
    assert (src == vocab.pad_id).any() and (tgt == vocab.pad_id).any()
    logits = model.forward(src, tgt)
    with torch.no_grad():
        theirs = hf(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != vocab.pad_id),
                    decoder_input_ids=torch.from_numpy(tgt),
                    decoder_attention_mask=torch.from_numpy(tgt != vocab.pad_id)).logits.numpy()
    error = np.abs(logits - theirs).max()
    print(f"\nexported model: logits differ by {error:.1e}")
    assert error <= 1e-10
    assert np.array_equal(hf.final_logits_bias.numpy(), np.zeros((1, vocab.size)))


def test_marian_tokenizer_gives_numformer_ids(exported):
    _, vocab, lines, folder = exported
    tok = MarianTokenizer.from_pretrained(str(folder))
    texts = lines + ["a b c", "zz unseen \u00e9 text", ""]
    for text, src, tgt in zip(texts, vocab.encode_source(texts), vocab.encode_target(texts)):
        assert tok(text)["input_ids"] == src + [vocab.eos_id]
        assert tok(text_target=text)["input_ids"] == tgt + [vocab.eos_id]
        if vocab.unk_id not in src:   # MarianTokenizer drops <unk> as a special token, numformer writes ⁇
            assert tok.decode(src + [vocab.eos_id], skip_special_tokens=True) == vocab.decode([src])[0] == text
    assert vocab.unk_id in vocab.encode_source(["zz unseen \u00e9 text"])[0]


def test_generate_greedy_equals_numformer_greedy(exported):
    path, vocab, lines, folder = exported
    assert len(lines) == 50
    model, _ = numformer_float64(path)
    ours, ours_ids, theirs, theirs_ids = greedy_both(model, vocab, hf_float64(folder),
                                                     MarianTokenizer.from_pretrained(str(folder)), lines)
    for line, a, b in zip(lines, ours, theirs):
        print(f"{line} -> {a!r} | {b!r}")
    assert ours_ids == theirs_ids
    assert ours == theirs
    assert sum(o.split() == s.split()[::-1] for o, s in zip(ours, lines)) >= len(lines) // 3   # it learned


# -- Marian in and back out ------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", transformers_names())  # relu, swish, silu, gelu, ...: the table's
def test_marian_to_numformer_to_marian_gives_identical_arrays(marian, tmp_path, capsys, activation):
    """Every array and tokenizer file back as it was; the config too, but for an activation_function that is
    not its row's first name (silu exports as swish, the same function): the row's first is written."""
    from safetensors.numpy import load_file

    case = marian(activation)
    out = export(case.npz, tmp_path / "again", capsys)
    before, after = load_file(str(case.folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()
    for name in before:
        assert before[name].dtype == after[name].dtype and np.array_equal(before[name], after[name]), name
    for name in ("source.spm", "target.spm"):
        assert (out / name).read_bytes() == (case.folder / name).read_bytes()
    assert json.loads((out / "vocab.json").read_text()) == json.loads((case.folder / "vocab.json").read_text())
    old, new = (json.loads((f / "config.json").read_text()) for f in (case.folder, out))
    keys = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "activation_function", "scale_embedding", "pad_token_id", "eos_token_id", "decoder_start_token_id",
            "max_position_embeddings", "dropout", "share_encoder_decoder_embeddings", "tie_word_embeddings")
    assert new["activation_function"] == from_transformers(activation).transformers[0]
    old["activation_function"] = new["activation_function"]
    assert {k: old[k] for k in keys} == {k: new[k] for k in keys}
    assert MarianMTModel.from_pretrained(str(out)).config.activation_function == new["activation_function"]
    tok_old, tok_new = MarianTokenizer.from_pretrained(str(case.folder)), MarianTokenizer.from_pretrained(str(out))
    texts = sentences(SRC_WORDS, 3, 10)
    assert tok_old(texts)["input_ids"] == tok_new(texts)["input_ids"]


def test_an_imported_model_decodes_greedily_as_transformers(marian):
    """numformer starts the imported decoder from pad (Marian's start) and bans pad, as the opus-mt
    models' generation config does (bad_words_ids [[pad]])."""
    case = marian("swish")
    model, vocab = numformer_float64(case.npz)
    lines = sentences(SRC_WORDS, 4, 6)
    ours, ours_ids, theirs, theirs_ids = greedy_both(model, vocab, case.hf, MarianTokenizer.from_pretrained(
        str(case.folder)), lines, bad_words_ids=[[vocab.pad_id]], forced_eos_token_id=vocab.eos_id)
    assert ours_ids == theirs_ids and ours == theirs
    assert any(ours_ids)


# -- refusals ----------------------------------------------------------------------------------------------------
def _numformer_file(tmp_path, reverse_model, **changes):
    path, vocab, _ = reverse_model
    ck = load_checkpoint(path)
    cfg = ModelConfig.from_dict(ck.meta["model_config"]).replace(**changes)
    out = tmp_path / "model.npz"
    save_checkpoint(out, Transformer(cfg, seed=1).state_dict(), dict(ck.meta, model_config=cfg.to_dict()),
                    vocab=ck.vocab)
    return out


@pytest.mark.parametrize("changes,needle", [({"pre_norm": True}, "pre-LN"),
                                            ({"positional": "learned"}, "positions are learned"),
                                            ({"tie_embeddings": False}, "untied"),
                                            ({"d_k": 4}, "d_k 4")])
def test_a_model_marian_cannot_hold_is_one_line(tmp_path, reverse_model, capsys, changes, needle):
    source = _numformer_file(tmp_path, reverse_model, **changes)
    code, _, err = run_main(main, ["export", str(source), "--format", "hf", "--out", str(tmp_path / "hf")], capsys)
    assert_one_line_error(code, err, PROG, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]   # no folder, no leftover


def test_an_output_folder_in_the_way_is_one_line(tmp_path, reverse_model, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    code, _, err = run_main(main, ["export", str(reverse_model[0]), "--format", "hf", "--out", str(tmp_path / "hf")],
                            capsys)
    assert_one_line_error(code, err, PROG, "not empty")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
