"""Exercise: the backward of a decoder layer (Section 3.1, Figure 1 right)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.gradcheck import GradCase
from numformer.model import DecoderLayer

from ..cases import B, D, S, T, _replay, padded_batch, small_config
from ..exercise import Exercise, named_gradients


def memory_gradient_dropped(self, dy):
    """The memory's gradient is dropped: the encoder-decoder attention's keys and values come from the memory, so it has one."""
    dy = self.ffn_residual.backward(dy, self.ffn)
    dy, _ = self.cross_attn_residual.backward(dy, self.cross_attn)
    dy = self.self_attn_residual.backward(dy, self.self_attn)
    return dy, None


def self_and_cross_attention_swapped(self, dy):
    """Self- and encoder-decoder attention run backward in the wrong order: forward ran self-attention first, so backward runs it last."""
    dy = self.ffn_residual.backward(dy, self.ffn)
    dy = self.self_attn_residual.backward(dy, self.self_attn)
    dy, dmemory = self.cross_attn_residual.backward(dy, self.cross_attn)
    return dy, dmemory


def cross_attention_pair_unpacked_reversed(self, dy):
    """The encoder-decoder residual returns (d_input, d_memory) in that order: unpacked the other way round, the memory's gradient flows down the decoder."""
    dy = self.ffn_residual.backward(dy, self.ffn)
    dmemory, dy = self.cross_attn_residual.backward(dy, self.cross_attn)
    dy = self.self_attn_residual.backward(dy, self.self_attn)
    return dy, dmemory


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    _, _, src_mask, tgt_mask = padded_batch(rng)
    out = []
    for pre in (False, True):
        rs = RandomState(seed + 12)
        m = cls(small_config(pre_norm=pre, dropout=0.1), rng, rs, np.float64)
        ins = {"y": rng.standard_normal((B, T, D)), "memory": rng.standard_normal((B, S, D))}
        out.append(GradCase("DecoderLayer", f"{'pre' if pre else 'post'}-LN, causal + padding, a fully masked "
                            "row, dropout 0.1 replayed", m, ins,
                            lambda m, i: m(i["y"], i["memory"], tgt_mask, src_mask),
                            lambda m, g: named_gradients(m.backward(g[0]), "DecoderLayer.backward", ("y", "memory")),
                            before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    name="decoder_layer", title="the backward of a decoder layer", paper="Section 3.1, Figure 1",
    target=DecoderLayer.backward, layer=DecoderLayer, cases=cases, show=(DecoderLayer.forward,),
    mistakes=(memory_gradient_dropped, self_and_cross_attention_swapped, cross_attention_pair_unpacked_reversed),
    swap="DecoderLayer",
    notes="The children: three Residuals (backward(dy, sublayer), the residual exercise) around self.self_attn, "
          "self.cross_attn and self.ffn. The encoder-decoder residual's backward returns (d_input, d_memory). "
          "Return (dy, dmemory): the decoder adds up every layer's dmemory.")
