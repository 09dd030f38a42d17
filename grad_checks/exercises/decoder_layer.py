"""Exercise: the backward of a decoder layer (Section 3.1, Figure 1 right)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
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
    stage="composition", rank=2,  # the encoder layer's backward and one more attention
    name="decoder_layer", title="the backward of a decoder layer", paper="Section 3.1, Figure 1",
    target=DecoderLayer.backward, layer=DecoderLayer, cases=cases, show=(DecoderLayer.forward,),
    mistakes=(memory_gradient_dropped, self_and_cross_attention_swapped, cross_attention_pair_unpacked_reversed),
    swap="DecoderLayer",
    notes="The children: three Residuals (backward(dy, sublayer), the residual exercise) around self.self_attn, "
          "self.cross_attn and self.ffn. The encoder-decoder residual's backward returns (d_input, d_memory). "
          "Return (dy, dmemory): the decoder adds up every layer's dmemory.",
    forward="""
        The forward: one decoder layer (Section 3.1, Figure 1 right), three sub-layers, each inside a residual
        connection with its LayerNorm and dropout (the residual exercise), in this order:

            h1 = Residual_1(y, SelfAttn)          self.self_attn_residual(y, self.self_attn, mask=self_mask)
                                                  masked self-attention: MultiHead(y, y, y), Section 3.2.3
            h2 = Residual_2(h1, CrossAttn, mem)   self.cross_attn_residual(h1, self.cross_attn, memory,
                                                  mask=cross_mask): MultiHead(h1, memory, memory), the
                                                  queries from h1, the keys and values from the memory
            out = Residual_3(h2, FFN)             self.ffn_residual(h2, self.ffn)
                                                  FFN(h2) = max(0, h2 W_1 + b_1) W_2 + b_2, Section 3.3

        y, h1, h2 and out are (B, T, d_model); memory, the encoder stack's output, is (B, S, d_model).
        self_mask (causal and padding) and cross_mask (the source's padding) have no gradient, and in training
        no cache is passed (incremental decoding runs in eval mode only). Residual_k(a, Sub) is LayerNorm(a +
        Dropout(Sub(a))) post-LN (the paper's form) or a + Dropout(Sub(LayerNorm(a))) pre-LN (Xiong et al.
        2020), the memory a second argument of Sub in Residual_2; all three share the form, and this layer
        need not know which.

        Your method is DecoderLayer.backward(self, dy), dy = dL/dout (B, T, d_model); the forward above ran
        first, in training mode. The children: three Residuals (the residual exercise), self.self_attn_residual,
        self.cross_attn_residual and self.ffn_residual, around self.self_attn, self.cross_attn and self.ffn. A
        Residual's backward(g, sublayer) takes g, the gradient of that residual's output, and the same sublayer
        its forward wrapped, returns the gradient of that residual's input a (B, T, d_model), and adds every
        parameter gradient it reaches into their .grad itself (accumulated). The encoder-decoder residual's
        backward returns a pair instead, (d_input, d_memory) in that order: the gradient of its input a and
        that of the memory (B, S, d_model). Each child's backward uses what its forward cached, once: call
        each exactly once. Return the pair (dy_in, dmemory): dL/dy (B, T, d_model) and this layer's dL/dmemory
        (B, S, d_model) (the decoder adds up every layer's dmemory).""",
    returns="Return (dL/dy (B, T, d_model), dL/dmemory (B, S, d_model)), the gradients of the layer's input and "
            "of the encoder's output, from dy (B, T, d_model), the gradient of the layer's output.",
    steps=("The layer is a composition of three residual sub-layers, out = R3(R2(R1(y), memory)), so by the "
           "chain rule the backward runs them in the reverse order of the forward: the feed-forward residual "
           "first, then the encoder-decoder attention residual, then the self-attention residual (forward ran "
           "self-attention first, so its backward comes last).",
           "The feed-forward residual's backward on dy, given self.ffn, returns dh2 (B, T, d_model), the "
           "gradient of the encoder-decoder residual's output.",
           "R2 has two inputs, h1 and the memory (its keys and values), so its backward returns two gradients, "
           "(d_input, d_memory) in that order: the encoder-decoder residual's backward on dh2, given "
           "self.cross_attn, gives dh1 (B, T, d_model), which goes on down the decoder layer, and dmemory "
           "(B, S, d_model), this layer's gradient of the memory. Unpacked the other way round, the memory's "
           "gradient would flow down the decoder.",
           "The self-attention residual's backward on dh1, given self.self_attn, returns dy_in. Within this "
           "layer the memory is used once (by the encoder-decoder attention), so its gradient is that one "
           "term; the decoder sums it over the layers, and the masks have no gradient. The whole backward: "
           "g = self.ffn_residual.backward(dy, self.ffn); g, dmemory = self.cross_attn_residual.backward(g, "
           "self.cross_attn); g = self.self_attn_residual.backward(g, self.self_attn); return (g, dmemory)."))
