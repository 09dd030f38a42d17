"""Hugging Face Marian (``MarianMTModel``, the opus-mt family) in and out of numformer.

Marian computes what numformer computes (post-LN layers, sinusoidal positions, embeddings scaled by
sqrt(d_model) and tied with the output projection), so a model passes from one to the other by names
and conventions alone:

* **names**: :func:`parameter_map` pairs every numformer parameter with its Marian weight (the shared
  embedding, q/k/v/out projections with biases, fc1/fc2, the three LayerNorms of a decoder layer, the
  frozen ``final_logits_bias``). ``torch.nn.Linear`` stores (out, in), numformer (in, out): transposed.
* **positions**: Marian's sinusoid puts sin in the columns ``[:d/2]`` and cos in ``[d/2:]``
  (``MarianSinusoidalPositionalEmbedding.create_weight``), numformer interleaves them (sin on even, cos on
  odd columns). With ``p = [0, 2, 4, ..., 1, 3, 5, ...]`` (:func:`marian_permutation`) Marian's table is
  numformer's with its columns taken in the order p. Every operation on the residual stream commutes
  with a permutation of its d_model axis (linear maps read or write it, LayerNorm's mean and variance
  do not see the order, gains and biases are permuted alike, the tied output projection is a dot
  product), so permuting the d_model axis of every weight that touches the stream (embedding columns,
  q/k/v and fc1 input rows, out-projection and fc2 output columns and biases, LayerNorm gains and
  biases) makes numformer's own positional table reproduce Marian exactly. The heads' axes and d_ff
  are not permuted.
* **ids**: a Marian vocabulary (two sentencepiece models, a joint ``vocab.json``; eos 0, pad V-1, the
  decoder starting from pad) is a :class:`~numformer.data.marian_vocab.MarianVocab` carried in the model
  file; the imported model gets ``logits_bias=True``, ``pad_row_gradient=False`` (``padding_idx``) and
  ``pad_id = pad_token_id``. An exported numformer model keeps numformer's ids (pad 0, unk 1, bos 2,
  eos 3) and tells Marian to start decoding from bos (``decoder_start_token_id = 2``).
* **layouts Marian does not have**: transformers' Marian is post-LN only (no ``normalize_before``, no
  final LayerNorm per stack, no embedding LayerNorm; legacy config keys asking for them are refused),
  so a pre-LN numformer model is refused for it, as are learned positions and untied embeddings.

:func:`import_marian` (``python -m numformer.checkpoint import``) reads a folder written by
``MarianMTModel.save_pretrained`` + ``MarianTokenizer.save_pretrained`` (or fetches a Hub id) and writes
an ordinary numformer model file; :func:`export_marian` (``... export RUN --format hf``) writes such a
folder from a numformer model. Neither needs ``transformers`` (``safetensors`` reads and writes the
weights; ``torch`` only for a legacy ``pytorch_model.bin``, ``huggingface_hub`` only to fetch).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from . import InteropError
from .hf_files import (BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, TOKEN_ID, check_value, field, read_json_object,
                       shown)
from ..files import atomic_folder
from ..data.errors import DataError
from ..data.marian_vocab import MarianVocab, is_marian_vocab_bytes
from ..errors import UsageError, first_line
from ..presets import ModelConfig

#: The weights' files of a Hugging Face model folder, in the order they are looked for.
SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
CONFIG = "config.json"
#: What an export writes besides the tokenizer files.
GENERATION_CONFIG, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = ("generation_config.json", "tokenizer_config.json",
                                                          "special_tokens_map.json")
#: What a Hub fetch downloads: config, tokenizer and safetensors weights; the PyTorch pickle only when a
#: repository has no safetensors (many opus-mt repositories hold both, 300 MB each).
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                "source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "special_tokens_map.json"]

#: Marian's ``activation_function`` -> numformer's ``ModelConfig.activation`` (Marian's swish is SiLU).
ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu"}
#: numformer's activation -> the name written into an exported config.json (opus-mt's own spelling).
MARIAN_ACTIVATION = {"relu": "relu", "silu": "swish"}
#: transformers' LayerNorm eps (``nn.LayerNorm``'s default; MarianConfig has no setting for it).
MARIAN_LN_EPS = 1e-5

# How a weight touches the residual stream (the axis :func:`marian_permutation` permutes):
EMBEDDING = "embedding"     # (V, d): columns
READS = "reads"             # a Linear reading the stream: torch (out, d) -> numformer (d, out), rows
WRITES = "writes"           # a Linear writing the stream: torch (d, in) -> numformer (in, d), columns
STREAM = "stream"           # a (d,) vector on the stream: out/fc2 biases, LayerNorm gains and biases
HIDDEN = "hidden"           # a (out,) bias off the stream: q/k/v and fc1 biases, not permuted
LOGITS_BIAS = "logits_bias"  # Marian (1, V) buffer -> numformer (V,)

#: The Marian weights that hold the shared embedding (save_pretrained keeps the first; older files more).
SHARED_NAMES = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight")
#: Marian's fixed positional tables: older files carry them; checked to be Marian's sinusoids, then dropped.
POSITION_NAMES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def marian_permutation(d_model: int) -> np.ndarray:
    """``p = [0, 2, 4, ..., 1, 3, 5, ...]``: Marian's positional table is numformer's with its columns in the
    order p (``marian[:, k] = numformer[:, p[k]]``), and so is every vector on the residual stream."""
    if d_model % 2:
        raise InteropError(f"d_model {d_model} is odd: Marian's sinusoid layout is defined here for an even d_model")
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def marian_sinusoids(n_positions: int, d_model: int) -> np.ndarray:
    """Marian's positional table (``MarianSinusoidalPositionalEmbedding.create_weight``), float64:
    ``sin(pos / 10000^(2i/d))`` in column i and ``cos`` of the same angle in column d/2 + i."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    i = np.arange(d_model // 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, 2 * i / d_model)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


def parameter_map(layers: int, decoder_layers: int, logits_bias: bool = True) -> list[tuple[str, str, str]]:
    """(numformer name, Marian name, how it touches the stream) for every weight of a post-LN, tied model
    with ``layers`` encoder and ``decoder_layers`` decoder layers (``final_logits_bias`` when ``logits_bias``)."""
    rows = [("src_embed.weight", "model.shared.weight", EMBEDDING)]
    if logits_bias:
        rows.append(("final_logits_bias", "final_logits_bias", LOGITS_BIAS))

    def attention(nf, hf):
        for ours, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
            out = ours == "w_o"
            rows.append((f"{nf}.{ours}.weight", f"{hf}.{theirs}.weight", WRITES if out else READS))
            rows.append((f"{nf}.{ours}.bias", f"{hf}.{theirs}.bias", STREAM if out else HIDDEN))

    def norm(nf, hf):
        rows.extend([(f"{nf}.weight", f"{hf}.weight", STREAM), (f"{nf}.bias", f"{hf}.bias", STREAM)])

    def ffn(nf, hf):
        rows.extend([(f"{nf}.w_1.weight", f"{hf}.fc1.weight", READS), (f"{nf}.w_1.bias", f"{hf}.fc1.bias", HIDDEN),
                     (f"{nf}.w_2.weight", f"{hf}.fc2.weight", WRITES), (f"{nf}.w_2.bias", f"{hf}.fc2.bias", STREAM)])

    for i in range(layers):
        nf, hf = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{nf}.self_attn", f"{hf}.self_attn")
        norm(f"{nf}.self_attn_residual.norm", f"{hf}.self_attn_layer_norm")
        ffn(f"{nf}.ffn", hf)
        norm(f"{nf}.ffn_residual.norm", f"{hf}.final_layer_norm")
    for i in range(decoder_layers):
        nf, hf = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{nf}.self_attn", f"{hf}.self_attn")
        norm(f"{nf}.self_attn_residual.norm", f"{hf}.self_attn_layer_norm")
        attention(f"{nf}.cross_attn", f"{hf}.encoder_attn")
        norm(f"{nf}.cross_attn_residual.norm", f"{hf}.encoder_attn_layer_norm")
        ffn(f"{nf}.ffn", hf)
        norm(f"{nf}.ffn_residual.norm", f"{hf}.final_layer_norm")
    return rows


def _to_numformer(a, kind, inv):
    if kind == EMBEDDING:
        return a[:, inv]
    if kind == READS:
        return a.T[inv, :]
    if kind == WRITES:
        return a.T[:, inv]
    if kind == STREAM:
        return a[inv]
    if kind == LOGITS_BIAS:
        return a.reshape(-1)
    return a


def _to_marian(a, kind, p):
    if kind == EMBEDDING:
        return a[:, p]
    if kind == READS:
        return a[p, :].T
    if kind == WRITES:
        return a[:, p].T
    if kind == STREAM:
        return a[p]
    if kind == LOGITS_BIAS:
        return a.reshape(1, -1)
    return a


def marian_to_numformer(state: dict, layers: int, decoder_layers: int, d_model: int, permutation=None,
                        strict: bool = True) -> dict:
    """Marian weights (or their gradients) by Marian name -> numformer's, by numformer name.

    ``permutation``: the column order (default :func:`marian_permutation`; tests plant a wrong one).
    ``strict``: every mapped weight must be there (``final_logits_bias`` may be missing: it is then
    absent from the result); otherwise the names present are mapped (gradients have no logits bias).
    """
    p = marian_permutation(d_model) if permutation is None else np.asarray(permutation)
    inv = np.argsort(p)
    out = {}
    for ours, theirs, kind in parameter_map(layers, decoder_layers):
        if theirs not in state:
            if strict and kind != LOGITS_BIAS:
                raise InteropError(f"the Marian weights lack {theirs}")
            continue
        out[ours] = np.ascontiguousarray(_to_numformer(np.asarray(state[theirs]), kind, inv))
    return out


def numformer_to_marian(state: dict, layers: int, decoder_layers: int, d_model: int, permutation=None) -> dict:
    """numformer weights by numformer name -> Marian's, by Marian name (the inverse of
    :func:`marian_to_numformer`); a missing ``final_logits_bias`` is left out (the caller writes zeros)."""
    p = marian_permutation(d_model) if permutation is None else np.asarray(permutation)
    out = {}
    for ours, theirs, kind in parameter_map(layers, decoder_layers):
        if ours not in state:
            if kind == LOGITS_BIAS:
                continue
            raise InteropError(f"the numformer model lacks {ours}")
        out[theirs] = np.ascontiguousarray(_to_marian(np.asarray(state[ours]), kind, p))
    return out


# ---------------------------------------------------------------------------------------------- configs
def _refuse(where, setting: str, why: str):
    raise InteropError(f"{where} is a Marian variant numformer cannot represent: {setting} ({why})")


def marian_special_ids(config: dict, path, vocab_size: int, where="the model") -> tuple[int, int, int]:
    """(pad, eos, decoder start) of a Marian ``config.json`` (the dict read from ``path``), each checked to be a
    token id of the ``vocab_size``-row vocabulary; the decoder starts from pad when the file does not say
    (MarianConfig's own default). An ``eos_token_id`` list of one id is that id; of several, a variant
    numformer cannot represent."""
    top = vocab_size - 1
    pad = field(config, "pad_token_id", TOKEN_ID, path, low=0, high=top)
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        if len(eos) != 1:
            _refuse(where, f"eos_token_id {shown(eos)}", "numformer needs one eos id")
        eos = check_value(eos[0], "eos_token_id", TOKEN_ID, path, low=0, high=top)
    else:
        eos = field(config, "eos_token_id", TOKEN_ID, path, low=0, high=top)
    start = field(config, "decoder_start_token_id", TOKEN_ID, path, default=pad, low=0, high=top, nullable=True)
    return pad, eos, start


def model_config_from_marian(config: dict, where="the model", path=None) -> ModelConfig:
    """A Marian ``config.json`` (as a dict, read from ``path``) -> numformer's ModelConfig. Every field it uses
    is checked for its type and range first (:mod:`numformer.interop.hf_files`: one InteropError line naming
    the file and the field); a variant numformer cannot represent is an InteropError naming the setting.
    Absent fields MarianConfig has a default for take that default; the sizes and ids must be there
    (``save_pretrained`` writes them all)."""
    c = config
    path = path if path is not None else f"{where}'s {CONFIG}"
    model_type = field(c, "model_type", STRING, path, default=None, nullable=True)
    if model_type != "marian":
        raise InteropError(f"{where} is not a Marian model: its config.json says model_type "
                           f"{shown(model_type)} (numformer imports MarianMTModel, model_type 'marian')")
    act = field(c, "activation_function", STRING, path, default="gelu")  # MarianConfig's own default
    if act not in ACTIVATIONS:
        _refuse(where, f"activation_function {act!r}", "numformer's feed-forward block has relu and swish/silu")
    if not field(c, "scale_embedding", BOOLEAN, path, default=False):
        _refuse(where, "scale_embedding false", "numformer always scales the embeddings by sqrt(d_model)")
    if not field(c, "share_encoder_decoder_embeddings", BOOLEAN, path, default=True):
        _refuse(where, "share_encoder_decoder_embeddings false", "untied embeddings: numformer imports one shared "
                "embedding, tied with the output projection")
    if not field(c, "tie_word_embeddings", BOOLEAN, path, default=True):
        _refuse(where, "tie_word_embeddings false", "an output projection apart from the embedding")
    vocab_size = field(c, "vocab_size", INTEGER, path, low=1)
    decoder_vocab_size = field(c, "decoder_vocab_size", INTEGER, path, default=None, low=1, nullable=True)
    if decoder_vocab_size not in (None, vocab_size):
        _refuse(where, f"decoder_vocab_size {decoder_vocab_size} != vocab_size {vocab_size}",
                "a separate target vocabulary")
    # keys of transformers 3.x's BART-based Marian: today's MarianMTModel ignores them, so a file that
    # sets them was made for a model transformers no longer computes
    for key, value, why in (("normalize_before", True, "pre-LN layers"),
                            ("add_final_layer_norm", True, "a final LayerNorm per stack"),
                            ("normalize_embedding", True, "a LayerNorm on the embeddings"),
                            ("layernorm_embedding", True, "a LayerNorm on the embeddings"),
                            ("static_position_embeddings", False, "learned positions"),
                            ("add_bias_logits", True, "a trained logits bias")):
        if field(c, key, BOOLEAN, path, default=None, nullable=True) is value:
            _refuse(where, f"{key} {str(value).lower()}", f"{why}; transformers' MarianMTModel is post-LN with "
                    "fixed sinusoids and computes none of it")
    sizes = {key: field(c, key, INTEGER, path, low=1) for key in (
        "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
        "encoder_ffn_dim", "decoder_ffn_dim")}
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if sizes[a] != sizes[b]:
            _refuse(where, f"{a} {sizes[a]} != {b} {sizes[b]}", "numformer's two stacks share these sizes")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if field(c, key, NUMBER, path, default=0.0, low=0, high=1):
            _refuse(where, f"{key} {c[key]}", "LayerDrop: numformer runs every layer")
    d = sizes["d_model"]
    if d % 2:
        _refuse(where, f"d_model {d}", "odd: Marian's sinusoid layout is taken here for an even d_model")
    dropouts = {key: field(c, key, NUMBER, path, default=default, low=0, below=1) for key, default in (
        ("dropout", 0.1), ("attention_dropout", 0.0), ("activation_dropout", 0.0))}  # MarianConfig's defaults
    max_len = field(c, "max_position_embeddings", INTEGER, path, low=2)
    pad, _, _ = marian_special_ids(c, path, vocab_size, where)
    try:
        cfg = ModelConfig(
            vocab_size=vocab_size, d_model=d, d_ff=sizes["encoder_ffn_dim"], heads=sizes["encoder_attention_heads"],
            layers=sizes["encoder_layers"], decoder_layers=sizes["decoder_layers"],
            dropout=float(dropouts["dropout"]), attn_dropout=float(dropouts["attention_dropout"]),
            relu_dropout=float(dropouts["activation_dropout"]), pre_norm=False, tie_embeddings=True,
            max_len=max_len, positional="sinusoidal", ln_eps=MARIAN_LN_EPS, pad_id=pad,
            activation=ACTIVATIONS[act], logits_bias=True, pad_row_gradient=False)
        return cfg.checked()
    except (UsageError, TypeError, ValueError) as exc:
        raise InteropError(f"{path} does not make a numformer model: {first_line(exc)}") from None


def _ids_of(cfg: ModelConfig, vocab) -> dict:
    return {"pad": vocab.pad_id, "eos": vocab.eos_id, "bos": vocab.bos_id, "unk": vocab.unk_id}


def marian_config_from_numformer(cfg: ModelConfig, vocab) -> dict:
    """numformer's ModelConfig and vocabulary -> a Marian ``config.json`` (a dict); an InteropError naming what
    Marian has no place for (pre-LN, learned positions, untied embeddings, heads of another width, an eps)."""
    why = None
    if cfg.pre_norm:
        why = ("it is pre-LN, and transformers' Marian is post-LN only: its layers normalise after the residual "
               "sum and its stacks have no final LayerNorm, so no weights reproduce a pre-LN model")
    elif cfg.positional != "sinusoidal":
        why = f"its positions are {cfg.positional}; Marian's are fixed sinusoids"
    elif not cfg.tie_embeddings:
        why = "its embeddings are untied; the export writes Marian's one shared embedding"
    elif cfg.head_dim_k * cfg.heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k:
        why = f"its heads are d_k {cfg.head_dim_k}, d_v {cfg.head_dim_v}; Marian's are d_model / heads"
    elif cfg.ln_eps != MARIAN_LN_EPS:
        why = f"its LayerNorm eps is {cfg.ln_eps}; Marian's is {MARIAN_LN_EPS}"
    elif cfg.d_model % 2:
        why = f"its d_model {cfg.d_model} is odd"
    elif getattr(cfg, "activation", "relu") not in MARIAN_ACTIVATION:
        why = f"its activation is {cfg.activation}"
    elif cfg.pad_id != vocab.pad_id:
        why = f"its pad id {cfg.pad_id} is not its vocabulary's {vocab.pad_id}"
    if why:
        raise InteropError(f"cannot export this model as a Hugging Face Marian model: {why}")
    ids = _ids_of(cfg, vocab)
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": cfg.vocab_size, "decoder_vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.layers, "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": MARIAN_ACTIVATION[getattr(cfg, "activation", "relu")],
        "dropout": cfg.dropout, "attention_dropout": cfg.attn_dropout, "activation_dropout": cfg.relu_dropout,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "max_position_embeddings": cfg.max_len, "scale_embedding": True,
        "pad_token_id": ids["pad"], "eos_token_id": ids["eos"], "forced_eos_token_id": ids["eos"],
        "decoder_start_token_id": ids["bos"], "bos_token_id": None,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
        "is_encoder_decoder": True, "use_cache": True, "init_std": 0.02, "dtype": "float32",
    }


def generation_config(cfg: ModelConfig, vocab) -> dict:
    """The ``generation_config.json`` of an export: numformer's search rules where transformers has them (it
    starts from bos, never emits pad or bos, forces eos at the length limit, stops at max_len)."""
    ids = _ids_of(cfg, vocab)
    banned = [[ids["pad"]]] + ([[ids["bos"]]] if ids["bos"] != ids["pad"] else [])
    return {"decoder_start_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"],
            "forced_eos_token_id": ids["eos"], "bad_words_ids": banned, "max_length": cfg.max_len}


# ---------------------------------------------------------------------------------------------- files
def read_hf_weights(folder) -> dict:
    """The weights of a Hugging Face model folder by name, as numpy arrays: ``model.safetensors`` (or its
    shards through ``model.safetensors.index.json``), else ``pytorch_model.bin`` (through torch). Half
    precision is widened to float32; float32 and float64 are kept."""
    folder = Path(folder)
    files = []
    if (folder / SAFETENSORS).is_file():
        files = [folder / SAFETENSORS]
    elif (folder / SAFETENSORS_INDEX).is_file():
        index_path = folder / SAFETENSORS_INDEX
        weight_map = field(read_json_object(index_path), "weight_map", OBJECT, index_path)
        files = [folder / check_value(f, f"weight_map[{name!r}]", STRING, index_path)
                 for name, f in weight_map.items()]
        files = sorted(set(files))
    state = {}
    if files:
        from safetensors.numpy import load_file  # noqa: PLC0415

        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as exc:  # noqa: BLE001  (missing shard, header, dtype numpy lacks)
                raise InteropError(f"cannot read the weights {f} ({first_line(exc)})") from None
    elif (folder / TORCH_BIN).is_file():
        try:
            import torch  # noqa: PLC0415
        except ImportError:
            raise InteropError(f"{folder / TORCH_BIN} is a PyTorch pickle and torch is not installed: install "
                               "torch, or save the model with safetensors") from None
        try:
            loaded = torch.load(str(folder / TORCH_BIN), map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001  (torch's message advises weights_only=False: never, for a file that fails)
            raise InteropError(f"{folder / TORCH_BIN} is not a PyTorch weights file numformer can read (damaged, cut "
                               "short, or holding more than tensors): save the model again with "
                               "MarianMTModel.save_pretrained (safetensors)") from None
        if not isinstance(loaded, dict) or not all(hasattr(v, "numpy") for v in loaded.values()):
            raise InteropError(f"{folder / TORCH_BIN} holds no mapping of weight names to tensors: save the model "
                               "again with MarianMTModel.save_pretrained")
        state = {k: (v.float() if v.dtype in (torch.float16, torch.bfloat16) else v).numpy() for k, v in loaded.items()}
    else:
        raise InteropError(f"{folder} holds no weights ({SAFETENSORS} or {TORCH_BIN}): save the model with "
                           "MarianMTModel.save_pretrained")
    return {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in state.items()}


def fetch(source) -> Path:
    """A Marian model's folder: ``source`` itself when it is a folder, else a Hub id downloaded through
    ``huggingface_hub.snapshot_download`` (the files :data:`HUB_PATTERNS` name, ``pytorch_model.bin`` only
    when there are no safetensors weights); no network, no such id, or no huggingface_hub: an InteropError
    in one line."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise InteropError(f"{source} is a file: give the folder a Marian model was saved to "
                           "(MarianMTModel.save_pretrained + MarianTokenizer.save_pretrained)")
    text = str(source)
    if text.startswith((".", "/", "~")) or text.count("/") != 1 or os.sep != "/" and os.sep in text:
        raise InteropError(f"{source} does not exist: give a Marian model's folder or a Hub id such as "
                           "Helsinki-NLP/opus-mt-en-de")
    try:
        from huggingface_hub import snapshot_download  # noqa: PLC0415
    except ImportError:
        raise InteropError(f"{source} is not a folder, and fetching it from the Hugging Face Hub needs "
                           "huggingface_hub: pip install 'numformer[interop]'") from None
    try:
        folder = Path(snapshot_download(repo_id=text, allow_patterns=HUB_PATTERNS))
        if not (folder / SAFETENSORS).is_file() and not (folder / SAFETENSORS_INDEX).is_file():
            folder = Path(snapshot_download(repo_id=text, allow_patterns=HUB_PATTERNS + [TORCH_BIN]))
        return folder
    except Exception as exc:  # noqa: BLE001  (offline, DNS, 404, auth: all mean "could not fetch")
        raise InteropError(f"{text} is not a folder, and fetching it from the Hugging Face Hub failed (no network, "
                           f"or no such model: {type(exc).__name__}): download it where there is a network and give "
                           "its folder") from None


def _shared_embedding(state: dict, where) -> np.ndarray:
    found = [n for n in SHARED_NAMES if n in state]
    if not found:
        raise InteropError(f"{where} has no shared embedding (model.shared.weight): not a MarianMTModel's weights")
    first = state[found[0]]
    for n in found[1:]:
        if state[n].shape != first.shape or not np.array_equal(state[n], first):
            _refuse(where, f"{n} differs from {found[0]}", "untied embeddings")
    return first


def import_marian(source, out, log=None) -> Path:
    """Read a Marian model (a folder, or a Hub id fetched) and write it as a numformer model file ``out``
    (weights permuted and renamed, the ModelConfig, the MarianVocab inside). Every check happens before
    anything is written; every refusal is one InteropError (or DataError) line."""
    say = log or (lambda *a: None)
    folder = fetch(source)
    where = str(source)
    if not (folder / CONFIG).is_file():
        raise InteropError(f"{where} has no {CONFIG}: not a Hugging Face model folder (save it with "
                           "MarianMTModel.save_pretrained)")
    config_path = folder / CONFIG
    config = read_json_object(config_path)
    cfg = model_config_from_marian(config, where, config_path)
    _, eos, decoder_start = marian_special_ids(config, config_path, cfg.vocab_size, where)
    transformers_version = field(config, "transformers_version", STRING, config_path, default=None, nullable=True)
    vocab = MarianVocab.from_files(folder, eos_id=eos, pad_id=cfg.pad_id, bos_id=decoder_start,
                                   size=cfg.vocab_size)
    n_pieces = len(vocab.pieces)
    state = read_hf_weights(folder)
    shared = _shared_embedding(state, where)
    if shared.ndim != 2 or shared.shape[1] != cfg.d_model:
        raise InteropError(f"{where}'s embedding has shape {shared.shape}, its config says d_model {cfg.d_model}")
    if shared.shape[0] != cfg.vocab_size or n_pieces != cfg.vocab_size:
        raise InteropError(f"{where}'s vocabulary size disagrees with its weights: vocab.json has {n_pieces} "
                           f"pieces, the embedding {shared.shape[0]} rows, config.json says vocab_size "
                           f"{cfg.vocab_size}")
    for name in POSITION_NAMES:
        if name in state:
            table = state.pop(name)
            want = marian_sinusoids(table.shape[0], cfg.d_model)
            if table.shape[1] != cfg.d_model or not np.allclose(table, want, atol=1e-4):
                _refuse(where, f"{name} is not Marian's sinusoid table", "positions numformer does not compute")
    for name in SHARED_NAMES[1:]:
        state.pop(name, None)
    state["model.shared.weight"] = shared
    for stack, n in (("encoder", cfg.layers), ("decoder", cfg.n_decoder_layers)):
        # the last layer the config names, before the map of every layer is built (a config.json claiming
        # a billion layers would otherwise build it)
        if f"model.{stack}.layers.{n - 1}.fc1.weight" not in state:
            raise InteropError(f"{where}'s weights have no layer {n - 1} of the {stack}, which config.json's "
                               f"{stack}_layers {n} asks for: the weights are not the model config.json describes")
    mapped = parameter_map(cfg.layers, cfg.n_decoder_layers)
    known = {theirs for _, theirs, _ in mapped}
    extra = sorted(set(state) - known)
    if extra:
        _refuse(where, f"weights numformer has no place for ({extra[0]}{', ...' if len(extra) > 1 else ''})",
                "a layout other than MarianMTModel's")
    missing = [theirs for _, theirs, kind in mapped if theirs not in state and kind != LOGITS_BIAS]
    if missing:
        raise InteropError(f"{where}'s weights lack {missing[0]}{' and more' if len(missing) > 1 else ''}: "
                           "the file is not the model its config.json describes")
    if "final_logits_bias" not in state:
        state["final_logits_bias"] = np.zeros((1, cfg.vocab_size), dtype=shared.dtype)
    dtype = np.float64 if shared.dtype == np.float64 else np.float32
    ours = {k: v.astype(dtype, copy=False) for k, v in
            marian_to_numformer(state, cfg.layers, cfg.n_decoder_layers, cfg.d_model).items()}
    _check_fits(cfg, ours, where, dtype)
    blob = vocab.to_bytes()
    meta = {"model_config": cfg.to_dict(), "vocab_size": cfg.vocab_size,
            "vocab_sha256": hashlib.sha256(blob).hexdigest(),
            "imported_from": {"format": "hf-marian", "source": where,
                              "transformers_version": transformers_version,
                              "decoder_start_token_id": decoder_start, "eos_token_id": eos,
                              "pad_token_id": cfg.pad_id}}
    from ..checkpoint import save_checkpoint  # noqa: PLC0415

    save_checkpoint(out, ours, meta, vocab=blob)
    say(f"imported {where}: {cfg.layers}+{cfg.n_decoder_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.vocab_size} pieces, {getattr(cfg, 'activation', 'relu')}")
    return Path(out)


def _check_fits(cfg: ModelConfig, state: dict, where, dtype) -> None:
    """The mapped weights load into numformer's Transformer of this config (names and shapes)."""
    from ..model import Transformer  # noqa: PLC0415

    expected = {n: v.shape for n, v in Transformer(cfg, seed=0, dtype=np.float32).state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise InteropError(f"{where}: numformer's model needs {name}, which the mapping did not give")
        if state[name].shape != shape:
            raise InteropError(f"{where}: {name} has shape {state[name].shape} after the mapping, numformer's model "
                               f"needs {shape}: the weights do not fit their config.json")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise InteropError(f"{where}: the mapping gave {extra[0]}, which numformer's model of this config lacks")


# ---------------------------------------------------------------------------------------------- export
def _tokenizer_files(vocab, folder: Path, max_len: int) -> None:
    """source.spm, target.spm, vocab.json, tokenizer_config.json and special_tokens_map.json for MarianTokenizer."""
    if isinstance(vocab, MarianVocab):
        vocab.save_files(folder)
        tokens, langs = vocab.tokens, (vocab.source_lang, vocab.target_lang)
    else:  # numformer's shared sentencepiece model: both sides, its own ids
        proto = vocab.to_bytes()
        (folder / "source.spm").write_bytes(proto)
        (folder / "target.spm").write_bytes(proto)
        pieces = {vocab.id_to_piece(i): i for i in range(vocab.size)}
        (folder / "vocab.json").write_text(json.dumps(pieces, ensure_ascii=False, indent=2), encoding="utf-8")
        tokens = {"eos": vocab.id_to_piece(vocab.eos_id), "unk": vocab.id_to_piece(vocab.unk_id),
                  "pad": vocab.id_to_piece(vocab.pad_id)}
        langs = (None, None)
    special = {f"{r}_token": tokens[r] for r in ("eos", "unk", "pad")}
    config = dict(special, tokenizer_class="MarianTokenizer", source_lang=langs[0], target_lang=langs[1],
                  model_max_length=int(max_len), separate_vocabs=False, sp_model_kwargs={})
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(special, ensure_ascii=False, indent=2), encoding="utf-8")


def export_marian(model_state: dict, cfg: ModelConfig, vocab, out) -> Path:
    """Write a numformer model (weights ``model_state`` by numformer name, its config, its vocabulary: a
    SubwordVocab or a MarianVocab) as a folder ``MarianMTModel.from_pretrained`` and
    ``MarianTokenizer.from_pretrained`` load. Written beside ``out`` and renamed into place: on any error
    nothing is left; ``out`` must not exist or be an empty folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InteropError(f"{out} already exists{' and is not empty' if out.is_dir() else ''}: choose a new "
                           "folder for the Hugging Face model")
    config = marian_config_from_numformer(cfg, vocab)
    if vocab.size != cfg.vocab_size:
        raise InteropError(f"the vocabulary has {vocab.size} pieces, the model {cfg.vocab_size} rows")
    weights = numformer_to_marian(model_state, cfg.layers, cfg.n_decoder_layers, cfg.d_model)
    if "final_logits_bias" not in weights:
        weights["final_logits_bias"] = np.zeros((1, cfg.vocab_size), dtype=weights["model.shared.weight"].dtype)
    dtypes = {str(v.dtype) for v in weights.values()}
    config["dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    from safetensors.numpy import save_file  # noqa: PLC0415

    def fill(stage: Path) -> None:
        save_file(weights, str(stage / SAFETENSORS), metadata={"format": "pt"})
        (stage / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        (stage / GENERATION_CONFIG).write_text(json.dumps(generation_config(cfg, vocab), indent=2), encoding="utf-8")
        _tokenizer_files(vocab, stage, cfg.max_len)
    return atomic_folder(out, fill)


def vocab_of(blob: bytes | None, fallback_path=None):
    """The vocabulary object a model file carries (a MarianVocab or a SubwordVocab), else the
    sentencepiece model at ``fallback_path``; DataError when neither is there."""
    from ..data.vocab import SubwordVocab  # noqa: PLC0415

    if blob is not None:
        return MarianVocab.from_bytes(blob) if is_marian_vocab_bytes(blob) else SubwordVocab.from_bytes(blob)
    if fallback_path is not None and Path(fallback_path).is_file():
        return SubwordVocab.load(fallback_path)
    raise DataError(f"the model carries no vocabulary and {fallback_path} does not exist")


__all__ = ["marian_permutation", "marian_sinusoids", "parameter_map", "marian_to_numformer", "numformer_to_marian",
           "marian_special_ids", "model_config_from_marian", "marian_config_from_numformer", "generation_config",
           "read_hf_weights", "fetch", "import_marian", "export_marian", "vocab_of"]
