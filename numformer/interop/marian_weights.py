"""Marian's weights <-> numformer's, by names and one column permutation.

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
"""
from __future__ import annotations

import numpy as np

from . import InteropError

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


__all__ = ["EMBEDDING", "READS", "WRITES", "STREAM", "HIDDEN", "LOGITS_BIAS", "SHARED_NAMES", "POSITION_NAMES",
           "marian_permutation", "marian_sinusoids", "parameter_map", "marian_to_numformer", "numformer_to_marian"]
