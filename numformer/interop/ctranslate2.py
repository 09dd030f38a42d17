"""numformer -> CTranslate2: a model directory the CTranslate2 engine (``ctranslate2.Translator``) decodes.

CTranslate2's specification API (``ctranslate2.specs.TransformerSpec``) describes the paper's encoder-decoder
with a few switches; a numformer model is set into it by names and conventions alone, through a
``ctranslate2.converters.Converter`` of numformer's own (:func:`converter_class`). CTranslate2's stock
converters cannot be used: its Marian loader drops the last vocabulary row (where Marian keeps pad) and forces
a zero start embedding, and none of them knows numformer's interleaved sinusoids.

What maps to what (numformer name -> CTranslate2 spec), V the vocabulary, d = d_model:

* **architecture**: ``TransformerSpec.from_config((layers, decoder_layers), heads, pre_norm=...,
  activation=...)``, the member of ``common_spec.Activation`` that ``ModelConfig.activation``'s row of
  :data:`numformer.activations.ACTIVATIONS` names (relu RELU, silu SWISH = ``x * sigmoid(x)``, gelu GELU, ...);
  ``config.layer_norm_epsilon = ln_eps``.
* **linear maps**: numformer's :class:`~numformer.layers.linear.Linear` computes ``y = x W + b`` with W (in, out);
  a CTranslate2 ``LinearSpec`` holds (out, in), as PyTorch does: every weight is transposed. Self-attention's
  three maps are one fused ``linear[0]`` of (3 d, d) rows ``[W_q^T; W_k^T; W_v^T]`` (biases concatenated
  alike): CTranslate2 splits its output into Q, K, V in that order, then each into heads as numformer does
  (head i = columns i*d_k .. (i+1)*d_k, :meth:`MultiHeadAttention._split`). Encoder-decoder attention: Q alone
  in ``linear[0]`` (it reads the decoder state), K and V fused in ``linear[1]`` (they read the memory).
  ``w_o`` is ``linear[-1]``; the feed-forward ``w_1``, ``w_2`` are ``linear_0``, ``linear_1``.
* **LayerNorms**: each :class:`~numformer.layers.sublayer.Residual`'s norm is the ``layer_norm`` of the
  sub-layer it wraps (``self_attention``, ``attention``, ``ffn``); CTranslate2 applies it before the sub-layer
  (pre-LN) or after the residual sum (post-LN, the paper's) as ``pre_norm`` says, as numformer does. A pre-LN
  stack's ``final_norm`` is the stack's ``layer_norm``. The norm's row of :data:`numformer.norms.NORMS` gives
  the stacks' keyword arguments (``ctranslate2``: none for LayerNorm) and its parameters, set as the
  ``LayerNormSpec``'s ``gamma`` (``weight``) and ``beta`` (``bias``).
* **embeddings**: the (V, d) matrices as they are (CTranslate2's embedding layout is numformer's), scaled by
  ``scale_embeddings`` = the model's own factor, sqrt(d_model) (:class:`~numformer.layers.embedding.Embedding`).
  Tied or untied, the encoder's, the decoder's and the projection's matrices are set apart (CTranslate2
  writes an identical array once).
* **positions**: given explicitly, ``position_encodings.encodings`` = numformer's (max_len, d) table: the
  sinusoids of :func:`numformer.layers.positional.sinusoid_table` (sin on even, cos on odd columns, position 0
  = the first token, cast to float32 as the model does), or a learned table (Table 3 row E) as trained.
  CTranslate2's built-in table differs on both counts (sin and cos in halves, and its first row is
  position 1), so leaving it out changes every output.
* **decoder start**: ``start_from_zero_embedding = False``: the decoder starts from the start token's own
  embedding row, the learned BOS ``<s>`` (id 2) of a numformer vocabulary, or for a model imported from
  Marian the pad row (its ``bos_id``) as the model holds it.
* **output projection**: the projection's weight (V, d) (the tied embedding matrix or ``generator.weight``),
  its bias the frozen ``final_logits_bias`` when the model has one (``ModelConfig.logits_bias``), else none.
* **vocabulary and special tokens**: the pieces in id order, as both the source and the target vocabulary
  (numformer's vocabulary is shared); ``bos_token`` / ``decoder_start_token`` = the piece of ``bos_id``,
  ``eos_token`` of ``eos_id``, ``unk_token`` of ``unk_id`` (``<s>``, ``</s>``, ``<unk>`` for numformer's
  SubwordVocab: pad 0, unk 1, bos 2, eos 3); ``add_source_eos = True``, no source BOS: numformer's
  encoder reads the sentence's ids + EOS (:func:`numformer.decoding.translation.source_batch`). CTranslate2
  keys its vocabulary by piece string, so a row whose piece names another id (a Marian map that leaves an
  id without a piece) is written as a unique placeholder (:func:`ct2_tokens`).

What CTranslate2 cannot hold is refused in one line (:class:`~numformer.interop.InteropError`, naming the
setting; :data:`REFUSALS`): d_k different from d_v (Table 3's row B: CTranslate2 gives queries, keys and values
one head size), an activation or a norm whose table row names no CTranslate2 counterpart.
Heads of d_k = d_v other than d_model / heads go in through the spec's ``head_dim``.

Decoding through the engine as numformer decodes: :func:`numformer_search_options` is the one set of
``translate_batch`` keyword options every comparison with the engine uses (bench/decode.py,
tests/interop/test_ctranslate2.py). With them greedy search equals numformer's by construction, an empty
output (EOS first) included, and beam search with alpha 0 too. Where they still differ: for alpha > 0 the
form of the length penalty, which CTranslate2 cannot express (GNMT's ``((5 + length) / 6) ** alpha`` against
its ``length ** length_penalty``); a beam cut by the length limit (numformer forces EOS and adds its
log-probability, CTranslate2 stops); and the limit is per call in CTranslate2, per sentence in numformer: one
call per limit gives the same outputs, one call per batch (the bench) gives its shorter sentences a looser one.

``ctranslate2`` is imported inside the functions only: numformer imports without it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import InteropError
from ..activations import ACTIVATIONS
from ..norms import NORMS
from ..checkpoint.trained_model import load_model
from ..files import atomic_folder
from ..layers.positional import sinusoid_table

#: ``Converter.convert``'s weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES), written here so
#: that the refusal of another name needs no ctranslate2 import; ``export --quantization`` offers these.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def _import_ctranslate2():
    try:
        import ctranslate2  # noqa: PLC0415
        import ctranslate2.converters  # noqa: PLC0415,F401
        import ctranslate2.specs  # noqa: PLC0415,F401
    except ImportError:
        raise InteropError("the CTranslate2 export needs the ctranslate2 package: pip install ctranslate2") from None
    return ctranslate2


#: The LayerNormSpec's names of a norm's parameters (a row of numformer.norms.NORMS names numformer's).
NORM_PARAMETERS = {"weight": "gamma", "bias": "beta"}

#: What CTranslate2's Transformer cannot hold: (the config has it, the one line saying so), in order. A new
#: setting it cannot hold is one row here; an activation or a norm is refused by its own table's row.
REFUSALS = (
    (lambda cfg: cfg.head_dim_k != cfg.head_dim_v,
     lambda cfg: f"CTranslate2 cannot hold d_k {cfg.head_dim_k} != d_v {cfg.head_dim_v} (Table 3's row B): its "
                 "attention gives queries, keys and values one head size"),
    (lambda cfg: cfg.activation not in ACTIVATIONS or not ACTIVATIONS[cfg.activation].ctranslate2,
     lambda cfg: "CTranslate2 export knows the activations "
                 f"{', '.join(name for name, row in ACTIVATIONS.items() if row.ctranslate2)}, not {cfg.activation!r}"),
    (lambda cfg: (cfg.norm not in NORMS or NORMS[cfg.norm].ctranslate2 is None
                  or not set(NORMS[cfg.norm].parameters) <= set(NORM_PARAMETERS)),
     lambda cfg: "CTranslate2 export knows the norms "
                 f"{', '.join(name for name, row in NORMS.items() if row.ctranslate2 is not None)}, not {cfg.norm!r}"),
)


def check_exportable(cfg) -> None:
    """InteropError (one line, naming the setting: :data:`REFUSALS`) unless CTranslate2's Transformer can hold a
    model of ``cfg`` (a :class:`~numformer.presets.ModelConfig`)."""
    for applies, why in REFUSALS:
        if applies(cfg):
            raise InteropError(why(cfg))


def ct2_tokens(vocab) -> list[str]:
    """The vocabulary's pieces in id order (ids 0 .. size-1): the token list CTranslate2 is given, so that
    CTranslate2's id of a piece is numformer's. A row whose piece maps back to another id (a Marian map
    with an id no piece names; ``id_to_piece`` then answers the unk piece) gets the placeholder
    ``<numformer_unused_ID>``: CTranslate2 keys its vocabulary by string and would merge the two."""
    tokens = []
    for i in range(vocab.size):
        piece = vocab.id_to_piece(i)
        tokens.append(piece if vocab.piece_to_id(piece) == i else f"<numformer_unused_{i}>")
    if len(set(tokens)) != len(tokens):  # cannot happen with the rule above; a damaged vocabulary would
        raise InteropError("the vocabulary names one piece for two ids: CTranslate2 keys its vocabulary by piece")
    return tokens


def suppressed(vocab) -> list[list[str]]:
    """``suppress_sequences`` for ``translate_batch``: numformer's searches never generate pad or the start
    token (:func:`numformer.decoding.search.ban_special`); one token each (one when they are the same id)."""
    tokens = ct2_tokens(vocab)
    return [[tokens[i]] for i in sorted({vocab.pad_id, vocab.bos_id})]


#: CTranslate2's ``length_penalty`` for a beam search numformer runs with alpha 0: not 0, because 0 switches
#: CTranslate2 to another stopping rule (stop once the best beam ends) where numformer stops when ``beam``
#: hypotheses have ended (fairseq's rule, CTranslate2's rule for any other penalty); so small that
#: ``length ** RAW_SCORE_PENALTY`` rounds to 1.0 in float32 for any length (1 + 1e-12 * ln(length)), so that
#: hypotheses are ranked by their log-probabilities alone, as numformer's alpha 0 ranks them.
RAW_SCORE_PENALTY = 1e-12


def numformer_search_options(vocab, beam: int, alpha: float, limit: int) -> dict:
    """The keyword options of ``ctranslate2.Translator.translate_batch`` under which the engine searches as
    numformer's :func:`~numformer.decoding.search.greedy_search` (``beam`` 1) or
    :func:`~numformer.decoding.search.beam_search` does, for sentences whose numformer output limit
    (:func:`~numformer.decoding.search.max_lengths`: tokens, the EOS it forces at the last counted) is
    ``limit``. Each option and why:

    * ``min_decoding_length=0``: numformer may end at the first step (an empty output); CTranslate2's default
      1 bans EOS there and emits a token instead.
    * ``max_decoding_length=limit - 1``: CTranslate2 counts the tokens before EOS, numformer counts EOS.
    * ``beam_size``, ``num_hypotheses=1``, ``patience=1``: the beam; a search stops once ``beam``
      hypotheses have ended (fairseq's rule, numformer's). CTranslate2's default beam is 2, not greedy.
    * ``length_penalty``: greedy search has none (0). A beam's score is its log-probability divided by a
      penalty of its length L counting EOS (CTranslate2 counts EOS in L whether it returns it or not: measured
      on 4.8, an EOS-first hypothesis scores log p(EOS) / 1). numformer's penalty is GNMT's
      ``((5 + L) / 6) ** alpha``, CTranslate2 4.x has only ``L ** length_penalty``: alpha is passed as the
      same exponent (equal at L = 1, not elsewhere), and alpha 0 as :data:`RAW_SCORE_PENALTY` (scores
      unchanged, numformer's stopping rule).
    * ``end_token`` = the vocabulary's EOS piece (the model's own, said explicitly), ``return_end_token=False``
      (hypotheses without EOS, as numformer's), ``suppress_sequences`` = :func:`suppressed` (pad and BOS are
      never generated).
    * ``max_input_length=0``: CTranslate2 cuts sources at 1024 tokens by default; numformer reads them whole.
    * left at their defaults, which are numformer's: ``coverage_penalty`` 0, ``repetition_penalty`` 1,
      ``no_repeat_ngram_size`` 0, ``disable_unk`` False, ``sampling_topk`` 1 (argmax), written out so that a
      change of CTranslate2's defaults cannot change the search.

    Raises InteropError for ``limit`` < 2: numformer's output is then always empty, and CTranslate2 cannot
    be told to decode no token (its ``max_decoding_length`` must be at least 1)."""
    if int(limit) < 2:
        raise InteropError(f"an output limit of {limit} token(s) allows only EOS: CTranslate2 decodes at least "
                           "one token; give numformer's limit (a * source length + b) of 2 or more")
    beam = int(beam)
    if beam < 1:
        raise InteropError(f"beam {beam}: the beam size must be at least 1")
    tokens = ct2_tokens(vocab)
    if beam == 1:
        penalty = 0.0
    else:
        penalty = float(alpha) if alpha else RAW_SCORE_PENALTY
    return {"beam_size": beam, "num_hypotheses": 1, "patience": 1.0, "length_penalty": penalty,
            "coverage_penalty": 0.0, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "disable_unk": False,
            "sampling_topk": 1, "min_decoding_length": 0, "max_decoding_length": int(limit) - 1,
            "max_input_length": 0, "end_token": tokens[vocab.eos_id], "return_end_token": False,
            "suppress_sequences": suppressed(vocab)}


def _linear(spec, weight, bias) -> None:
    """numformer Linear (W (in, out), b (out,)) -> LinearSpec (weight (out, in), bias (out,))."""
    spec.weight = np.ascontiguousarray(weight.T, dtype=np.float32)
    spec.bias = np.asarray(bias, dtype=np.float32)


def _fused(spec, state, prefix: str, names) -> None:
    """Several numformer Linears reading one input (q, k, v) -> one LinearSpec, outputs stacked in ``names``
    order: weight (sum of outs, in) = [W_n^T; ...], bias concatenated alike."""
    spec.weight = np.ascontiguousarray(np.concatenate([state[f"{prefix}.{n}.weight"].T for n in names]),
                                       dtype=np.float32)
    spec.bias = np.concatenate([state[f"{prefix}.{n}.bias"] for n in names]).astype(np.float32)


def _layer_norm(spec, state, prefix: str) -> None:
    """A numformer norm ``prefix`` (its parameters: its row's, LayerNorm's weight and bias) -> a LayerNormSpec."""
    for ours, theirs in NORM_PARAMETERS.items():
        if f"{prefix}.{ours}" in state:
            setattr(spec, theirs, np.asarray(state[f"{prefix}.{ours}"], dtype=np.float32))


def _attention(spec, state, prefix: str, norm: str, cross: bool) -> None:
    """One MultiHeadAttention (numformer ``prefix``: w_q, w_k, w_v, w_o) and the LayerNorm of its Residual."""
    if cross:  # queries read the decoder state, keys and values the memory: two input maps
        _linear(spec.linear[0], state[f"{prefix}.w_q.weight"], state[f"{prefix}.w_q.bias"])
        _fused(spec.linear[1], state, prefix, ("w_k", "w_v"))
    else:
        _fused(spec.linear[0], state, prefix, ("w_q", "w_k", "w_v"))
    _linear(spec.linear[-1], state[f"{prefix}.w_o.weight"], state[f"{prefix}.w_o.bias"])
    _layer_norm(spec.layer_norm, state, norm)


def _ffn(spec, state, prefix: str) -> None:
    """FeedForward ``prefix`` (w_1, w_2) and the LayerNorm of its Residual."""
    _linear(spec.linear_0, state[f"{prefix}.ffn.w_1.weight"], state[f"{prefix}.ffn.w_1.bias"])
    _linear(spec.linear_1, state[f"{prefix}.ffn.w_2.weight"], state[f"{prefix}.ffn.w_2.bias"])
    _layer_norm(spec.layer_norm, state, f"{prefix}.ffn_residual.norm")


def position_table(cfg, state, side: str) -> np.ndarray:
    """(max_len, d_model) float32: what numformer adds to the embeddings of the ``side`` ("src" or "tgt") stack
    at positions 0 .. max_len-1 (row 0 for the first token): the sinusoids (not in the state dict: rebuilt
    from the config, as the model does) or the learned table."""
    if cfg.positional == "learned":
        return np.asarray(state[f"{side}_pos.weight"], dtype=np.float32)
    return sinusoid_table(cfg.max_len, cfg.d_model).astype(np.float32)


def _embedding_scale(model_or_none, cfg) -> float:
    """The factor numformer's Embedding multiplies rows by: the model's own when given, else sqrt(d_model)."""
    scale = getattr(getattr(model_or_none, "src_embed", None), "scale", None)
    return float(scale) if scale is not None else float(np.sqrt(cfg.d_model))


def transformer_spec(cfg, state: dict, vocab, embedding_scale: float | None = None):
    """A ``ctranslate2.specs.TransformerSpec`` holding the numformer model ``cfg`` / ``state`` (parameter name ->
    host array, :meth:`Module.state_dict`) and its vocabulary ``vocab`` (SubwordVocab or MarianVocab); see
    the module docstring for every mapping. ``embedding_scale``: the embeddings' factor (default sqrt(d_model),
    numformer's). Raises InteropError (one line) for a config CTranslate2 cannot hold."""
    _import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec as ts  # noqa: PLC0415

    check_exportable(cfg)
    if vocab.size != cfg.vocab_size:
        raise InteropError(f"the vocabulary has {vocab.size} pieces, the model {cfg.vocab_size} rows")
    # the stacks' settings, said once for both: heads of d_k != d_model / heads (Table 3's rows A and C set d_k
    # explicitly) through head_dim (None: d_model / heads), the norm's own keywords from its row
    activation = getattr(common_spec.Activation, ACTIVATIONS[cfg.activation].ctranslate2)
    stack = dict(pre_norm=cfg.pre_norm, activation=activation,
                 head_dim=None if cfg.head_dim_k * cfg.heads == cfg.d_model else cfg.head_dim_k,
                 **NORMS[cfg.norm].ctranslate2)
    spec = ts.TransformerSpec(ts.TransformerEncoderSpec(cfg.layers, cfg.heads, **stack),
                              ts.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.heads, **stack))
    scale = float(np.sqrt(cfg.d_model)) if embedding_scale is None else float(embedding_scale)
    enc, dec = spec.encoder, spec.decoder

    enc.embeddings[0].weight = np.asarray(state["src_embed.weight"], dtype=np.float32)
    enc.scale_embeddings = scale
    enc.position_encodings.encodings = position_table(cfg, state, "src")
    for i, layer in enumerate(enc.layer):
        p = f"encoder.layers.{i}"
        _attention(layer.self_attention, state, f"{p}.self_attn", f"{p}.self_attn_residual.norm", cross=False)
        _ffn(layer.ffn, state, p)
    if cfg.pre_norm:
        _layer_norm(enc.layer_norm, state, "encoder.final_norm")

    # tied: "tgt_embed.weight" is not in the state dict (the one matrix is listed once, as src_embed.weight)
    dec.embeddings.weight = np.asarray(state.get("tgt_embed.weight", state["src_embed.weight"]), dtype=np.float32)
    dec.scale_embeddings = scale
    dec.position_encodings.encodings = position_table(cfg, state, "tgt")
    dec.start_from_zero_embedding = False  # the start token's own row: numformer's BOS, or Marian's pad row
    for i, layer in enumerate(dec.layer):
        p = f"decoder.layers.{i}"
        _attention(layer.self_attention, state, f"{p}.self_attn", f"{p}.self_attn_residual.norm", cross=False)
        _attention(layer.attention, state, f"{p}.cross_attn", f"{p}.cross_attn_residual.norm", cross=True)
        _ffn(layer.ffn, state, p)
    if cfg.pre_norm:
        _layer_norm(dec.layer_norm, state, "decoder.final_norm")
    dec.projection.weight = np.asarray(state.get("generator.weight", state["src_embed.weight"]), dtype=np.float32)
    if cfg.logits_bias:
        dec.projection.bias = np.asarray(state["final_logits_bias"], dtype=np.float32).reshape(-1)

    tokens = ct2_tokens(vocab)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    config = spec.config
    config.bos_token = tokens[vocab.bos_id]
    config.eos_token = tokens[vocab.eos_id]
    config.unk_token = tokens[vocab.unk_id]
    config.decoder_start_token = tokens[vocab.bos_id]
    config.add_source_bos = False
    config.add_source_eos = True   # numformer's encoder input: the sentence's ids + EOS
    config.layer_norm_epsilon = float(cfg.ln_eps)
    return spec


_CONVERTER = None


def converter_class():
    """``NumformerConverter``, a ``ctranslate2.converters.Converter`` whose ``_load`` returns
    :func:`transformer_spec` of the model it was made with: ``NumformerConverter(cfg, state, vocab)`` or
    ``NumformerConverter.from_model(model, vocab)``, then ``.convert(out_dir, quantization=...)`` as any
    CTranslate2 converter. Built on first call (the base class is ctranslate2's)."""
    global _CONVERTER
    if _CONVERTER is None:
        ct2 = _import_ctranslate2()

        class NumformerConverter(ct2.converters.Converter):
            """A numformer model (config, state dict, vocabulary) into CTranslate2's Transformer spec."""

            def __init__(self, cfg, state: dict, vocab, embedding_scale: float | None = None):
                self.cfg, self.state, self.vocab, self.embedding_scale = cfg, state, vocab, embedding_scale

            @classmethod
            def from_model(cls, model, vocab):
                """A loaded :class:`~numformer.model.Transformer` (any device; its weights are copied to the host)."""
                return cls(model.cfg, model.state_dict(), vocab, _embedding_scale(model, model.cfg))

            def _load(self):
                return transformer_spec(self.cfg, self.state, self.vocab, self.embedding_scale)

        _CONVERTER = NumformerConverter
    return _CONVERTER


def check_quantization(quantization) -> None:
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InteropError(f"unknown CTranslate2 quantization {quantization!r}: choose {', '.join(QUANTIZATIONS)}")


def convert(converter, out, quantization: str | None = None) -> Path:
    """Run ``converter`` (a CTranslate2 Converter) into the folder ``out``: written beside it and renamed into
    place, so that on any error nothing is left; ``out`` must not exist or be an empty folder."""
    check_quantization(quantization)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InteropError(f"{out} already exists{' and is not empty' if out.is_dir() else ''}: choose a new "
                           "folder for the CTranslate2 model")
    return atomic_folder(out, lambda stage: converter.convert(str(stage), quantization=quantization, force=True))


def export_model(model, vocab, out, quantization: str | None = None) -> Path:
    """A loaded numformer model and its vocabulary -> the CTranslate2 model folder ``out`` (see :func:`convert`)."""
    check_quantization(quantization)
    check_exportable(model.cfg)
    return convert(converter_class().from_model(model, vocab), out, quantization)


def export_ctranslate2(model_file_or_run, out_dir, quantization: str | None = None) -> Path:
    """``python -m numformer.checkpoint export RUN --format ctranslate2 --out DIR [--quantization int8]``: the model
    a run folder or model file names (:func:`numformer.checkpoint.trained_model.load_model`: its averaged or
    newest checkpoint, its own vocabulary or the run's ``spm.model``) as a CTranslate2 model folder ``out_dir``,
    weights stored as ``quantization`` (None: as they are, float32; ``"int8"``, ``"float16"``, ...: see
    :data:`QUANTIZATIONS`). Returns ``out_dir``. Errors are NumformerErrors with one line: a model CTranslate2
    cannot hold, ctranslate2 not installed, an existing non-empty ``out_dir``, an unknown quantization."""
    check_quantization(quantization)
    _import_ctranslate2()
    model, vocab, _ = load_model(model_file_or_run, device="cpu")
    return export_model(model, vocab, out_dir, quantization)


__all__ = ["QUANTIZATIONS", "RAW_SCORE_PENALTY", "NORM_PARAMETERS", "REFUSALS", "check_exportable", "ct2_tokens", "suppressed",
           "numformer_search_options", "position_table", "transformer_spec", "converter_class",
           "convert", "export_model", "export_ctranslate2"]
