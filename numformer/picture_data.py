"""What the pictures of a model are drawn from, shared by ``python -m numformer.plot``,
``python -m numformer.attention_maps`` and the TensorBoard log of a run: the layer each parameter
belongs to, and every head's attention weights for one sentence pair.
"""
from __future__ import annotations

import numpy as np

from .backend import to_host
from .decoding.translation import source_batch
from .layers import ScaledDotProductAttention


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: 'encoder.layers.0.ffn.w_1.weight' -> 'encoder.layers.0'."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return ".".join(parts[:3])
    return parts[0]


def record_attention(model, src_ids: list, tgt_ids: list, bos_id: int, eos_id: int) -> dict:
    """Teacher-forced forward pass recording attention weights.

    -> {"encoder": [(heads, S, S) per layer], "decoder": [(heads, T, T)], "cross": [(heads, T, S)]}
    as host float arrays; S counts the source EOS, T the BOS.
    """
    pad = model.cfg.pad_id
    attn = [m for m in model.modules() if isinstance(m, ScaledDotProductAttention)]
    was_training = model.training
    model.eval()
    for m in attn:
        m.record_weights = True
    try:
        src = source_batch([src_ids], pad, eos_id)
        tgt_in = np.array([[bos_id] + list(tgt_ids)], dtype=np.int64)
        model(model.xp.asarray(src), model.xp.asarray(tgt_in))
        maps = {
            "encoder": [to_host(layer.self_attn.attention.weights[0]) for layer in model.encoder.layers],
            "decoder": [to_host(layer.self_attn.attention.weights[0]) for layer in model.decoder.layers],
            "cross": [to_host(layer.cross_attn.attention.weights[0]) for layer in model.decoder.layers],
        }
    finally:
        for m in attn:
            m.record_weights = False
            m.weights = None
        model.train(was_training)
    return maps
