"""A Marian ``config.json`` <-> numformer's :class:`~numformer.presets.ModelConfig`, and the special ids.

* **ids**: a Marian vocabulary (two sentencepiece models, a joint ``vocab.json``; eos 0, pad V-1, the
  decoder starting from pad) is a :class:`~numformer.data.marian_vocab.MarianVocab` carried in the model
  file; the imported model gets ``logits_bias=True``, ``pad_row_gradient=False`` (``padding_idx``) and
  ``pad_id = pad_token_id``. An exported numformer model keeps numformer's ids (pad 0, unk 1, bos 2,
  eos 3) and tells Marian to start decoding from bos (``decoder_start_token_id = 2``).
* **layouts Marian does not have**: transformers' Marian is post-LN only (no ``normalize_before``, no
  final LayerNorm per stack, no embedding LayerNorm; legacy config keys asking for them are refused),
  so a pre-LN numformer model is refused for it, as are learned positions and untied embeddings.

Every field read is checked for its type and range (:mod:`numformer.data.hf_files`); what numformer cannot
represent is one :class:`~numformer.interop.InteropError` line naming the setting (:func:`refuse`).
"""
from __future__ import annotations

from . import InteropError
from ..activations import ACTIVATIONS as TABLE, from_transformers, transformers_names
from ..data.hf_files import BOOLEAN, INTEGER, NUMBER, STRING, TOKEN_ID, check_value, field, shown
from ..errors import UsageError, first_line
from ..norms import NORMS
from ..presets import ModelConfig

#: The model folder's configuration file.
CONFIG = "config.json"
#: Marian's ``activation_function`` -> numformer's ``ModelConfig.activation`` (Marian's swish is SiLU), from
#: the activations' table (numformer.activations: each row's transformers names).
ACTIVATIONS = {name: from_transformers(name).name for name in transformers_names()}
#: numformer's activation -> the name written into an exported config.json (the row's first: opus-mt's swish).
#: A view of the table, for reading; the import and the export read the table itself when they run.
MARIAN_ACTIVATION = {row.name: row.transformers[0] for row in TABLE.values()}
#: transformers' LayerNorm eps (``nn.LayerNorm``'s default; MarianConfig has no setting for it).
MARIAN_LN_EPS = 1e-5


def refuse(where, setting: str, why: str):
    """InteropError: ``where`` is a Marian variant numformer cannot represent (``setting``, ``why``)."""
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
            refuse(where, f"eos_token_id {shown(eos)}", "numformer needs one eos id")
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
    row = from_transformers(act)  # the activations' table, read now
    if row is None:
        refuse(where, f"activation_function {act!r}",
               f"numformer's feed-forward block has {', '.join(transformers_names())}")
    if not field(c, "scale_embedding", BOOLEAN, path, default=False):
        refuse(where, "scale_embedding false", "numformer always scales the embeddings by sqrt(d_model)")
    if not field(c, "share_encoder_decoder_embeddings", BOOLEAN, path, default=True):
        refuse(where, "share_encoder_decoder_embeddings false", "untied embeddings: numformer imports one shared "
               "embedding, tied with the output projection")
    if not field(c, "tie_word_embeddings", BOOLEAN, path, default=True):
        refuse(where, "tie_word_embeddings false", "an output projection apart from the embedding")
    vocab_size = field(c, "vocab_size", INTEGER, path, low=1)
    decoder_vocab_size = field(c, "decoder_vocab_size", INTEGER, path, default=None, low=1, nullable=True)
    if decoder_vocab_size not in (None, vocab_size):
        refuse(where, f"decoder_vocab_size {decoder_vocab_size} != vocab_size {vocab_size}",
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
            refuse(where, f"{key} {str(value).lower()}", f"{why}; transformers' MarianMTModel is post-LN with "
                   "fixed sinusoids and computes none of it")
    sizes = {key: field(c, key, INTEGER, path, low=1) for key in (
        "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
        "encoder_ffn_dim", "decoder_ffn_dim")}
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if sizes[a] != sizes[b]:
            refuse(where, f"{a} {sizes[a]} != {b} {sizes[b]}", "numformer's two stacks share these sizes")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
        if field(c, key, NUMBER, path, default=0.0, low=0, high=1):
            refuse(where, f"{key} {c[key]}", "LayerDrop: numformer runs every layer")
    d = sizes["d_model"]
    if d % 2:
        refuse(where, f"d_model {d}", "odd: Marian's sinusoid layout is taken here for an even d_model")
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
            activation=row.name, logits_bias=True, pad_row_gradient=False)
        return cfg.checked()
    except (UsageError, TypeError, ValueError) as exc:
        raise InteropError(f"{path} does not make a numformer model: {first_line(exc)}") from None


def _ids_of(cfg: ModelConfig, vocab) -> dict:
    return {"pad": vocab.pad_id, "eos": vocab.eos_id, "bos": vocab.bos_id, "unk": vocab.unk_id}


#: What a Marian ``config.json`` has no place for, in the order a refusal names it: (the model's setting is one
#: of these, why: the line's end). Each test reads the ModelConfig and the vocabulary; a new setting Marian
#: cannot hold is one row here (an activation or a norm: its table's row says it, and the rows below read it).
EXPORT_REFUSALS = (
    (lambda cfg, vocab: cfg.pre_norm,
     lambda cfg, vocab: "it is pre-LN, and transformers' Marian is post-LN only: its layers normalise after the "
                        "residual sum and its stacks have no final LayerNorm, so no weights reproduce a pre-LN model"),
    (lambda cfg, vocab: cfg.positional != "sinusoidal",
     lambda cfg, vocab: f"its positions are {cfg.positional}; Marian's are fixed sinusoids"),
    (lambda cfg, vocab: not cfg.tie_embeddings,
     lambda cfg, vocab: "its embeddings are untied; the export writes Marian's one shared embedding"),
    (lambda cfg, vocab: cfg.head_dim_k * cfg.heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k,
     lambda cfg, vocab: f"its heads are d_k {cfg.head_dim_k}, d_v {cfg.head_dim_v}; Marian's are d_model / heads"),
    (lambda cfg, vocab: not NORMS[cfg.norm].marian,
     lambda cfg, vocab: f"its norm is {cfg.norm}; Marian's is "
                        f"{', '.join(name for name, row in NORMS.items() if row.marian)}"),
    (lambda cfg, vocab: cfg.ln_eps != MARIAN_LN_EPS,
     lambda cfg, vocab: f"its LayerNorm eps is {cfg.ln_eps}; Marian's is {MARIAN_LN_EPS}"),
    (lambda cfg, vocab: cfg.d_model % 2, lambda cfg, vocab: f"its d_model {cfg.d_model} is odd"),
    (lambda cfg, vocab: cfg.activation not in TABLE or not TABLE[cfg.activation].transformers,
     lambda cfg, vocab: f"its activation is {cfg.activation}"),
    (lambda cfg, vocab: cfg.pad_id != vocab.pad_id,
     lambda cfg, vocab: f"its pad id {cfg.pad_id} is not its vocabulary's {vocab.pad_id}"),
)


def export_refusal(cfg: ModelConfig, vocab) -> str | None:
    """Why a Marian ``config.json`` cannot hold ``cfg`` (the first row of :data:`EXPORT_REFUSALS` that applies), or
    None."""
    return next((why(cfg, vocab) for applies, why in EXPORT_REFUSALS if applies(cfg, vocab)), None)


def marian_config_from_numformer(cfg: ModelConfig, vocab) -> dict:
    """numformer's ModelConfig and vocabulary -> a Marian ``config.json`` (a dict); an InteropError naming what
    Marian has no place for (:data:`EXPORT_REFUSALS`: pre-LN, learned positions, untied embeddings, heads of
    another width, a norm or an activation transformers' Marian does not compute, an eps)."""
    why = export_refusal(cfg, vocab)
    if why:
        raise InteropError(f"cannot export this model as a Hugging Face Marian model: {why}")
    ids = _ids_of(cfg, vocab)
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": cfg.vocab_size, "decoder_vocab_size": cfg.vocab_size, "d_model": cfg.d_model,
        "encoder_layers": cfg.layers, "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.heads, "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": TABLE[cfg.activation].transformers[0],
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


__all__ = ["CONFIG", "ACTIVATIONS", "EXPORT_REFUSALS", "MARIAN_ACTIVATION", "MARIAN_LN_EPS", "export_refusal",
           "refuse", "marian_special_ids",
           "model_config_from_marian", "marian_config_from_numformer", "generation_config"]
