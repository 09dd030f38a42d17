"""Exercise 16 of 18: the backward of a decoder layer (Section 3.1, Figure 1). Level: derive.

The forward: one decoder layer (Section 3.1, Figure 1 right), three sub-layers, each inside a
residual connection with its LayerNorm and dropout (the residual exercise), in this order:

    h1 = Residual_1(y, SelfAttn)          self.self_attn_residual(y, self.self_attn, mask=self_mask)
                                          masked self-attention: MultiHead(y, y, y), Section 3.2.3
    h2 = Residual_2(h1, CrossAttn, mem)   self.cross_attn_residual(h1, self.cross_attn, memory,
                                          mask=cross_mask): MultiHead(h1, memory, memory), the
                                          queries from h1, the keys and values from the memory
    out = Residual_3(h2, FFN)             self.ffn_residual(h2, self.ffn)
                                          FFN(h2) = max(0, h2 W_1 + b_1) W_2 + b_2, Section 3.3

y, h1, h2 and out are (B, T, d_model); memory, the encoder stack's output, is (B, S, d_model).
self_mask (causal and padding) and cross_mask (the source's padding) have no gradient, and in
training no cache is passed (incremental decoding runs in eval mode only). Residual_k(a, Sub) is
LayerNorm(a + Dropout(Sub(a))) post-LN (the paper's form) or a + Dropout(Sub(LayerNorm(a))) pre-LN
(Xiong et al. 2020), the memory a second argument of Sub in Residual_2; all three share the form,
and this layer need not know which.

Your method is DecoderLayer.backward(self, dy), dy = dL/dout (B, T, d_model); the forward above ran
first, in training mode. The children: three Residuals (the residual exercise),
self.self_attn_residual, self.cross_attn_residual and self.ffn_residual, around self.self_attn,
self.cross_attn and self.ffn. A Residual's backward(g, sublayer) takes g, the gradient of that
residual's output, and the same sublayer its forward wrapped, returns the gradient of that
residual's input a (B, T, d_model), and adds every parameter gradient it reaches into their .grad
itself (accumulated). The encoder-decoder residual's backward returns a pair instead, (d_input,
d_memory) in that order: the gradient of its input a and that of the memory (B, S, d_model). Each
child's backward uses what its forward cached, once: call each exactly once. Return the pair (dy_in,
dmemory): dL/dy (B, T, d_model) and this layer's dL/dmemory (B, S, d_model) (the decoder adds up
every layer's dmemory).

Your part: derive the backward pass on paper from the forward above, then write the body of
DecoderLayer.backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (4 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_decoder_layer.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_decoder_layer.py

When it checks exact, train with it (every DecoderLayer numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap DecoderLayer=bench/held_out_grading_6/answers/my_decoder_layer.py:DecoderLayer
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap DecoderLayer=bench/held_out_grading_6/answers/my_decoder_layer.py:DecoderLayer
"""

import numpy as np

from numformer.model import DecoderLayer as NumformerDecoderLayer

EXERCISE = "decoder_layer"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.model.DecoderLayer.forward:
# def forward(self, y, memory, self_mask, cross_mask, cache: DecoderLayerCache | None = None):
#     """y (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model).
#
#     ``cache`` (incremental decoding, eval mode only, Section 6.1; None in training): this layer's
#     :class:`~numformer.layers.kv_cache.DecoderLayerCache`. y is then the newest position (T = 1): the
#     self-attention appends its keys/values to ``cache.self_attn`` (no mask: it sees every cached
#     position), the encoder-decoder attention projects the memory into ``cache.cross_attn`` once.
#     With ``cache.beam`` k > 1, y holds k hypotheses per sentence (row s*k + j, B = B' * k) and memory
#     one row per sentence (B', S, d_model): the encoder-decoder attention takes each sentence's k
#     queries together, y seen as (B', k*T, d_model) (queries attend independently, so this equals
#     repeating the memory k times, with k times smaller caches).
#     """
#     self_cache, cross_cache, k = (None, None, 1) if cache is None else (cache.self_attn, cache.cross_attn,
#                                                                         cache.beam)
#     y = self.self_attn_residual(y, self.self_attn, mask=self_mask, cache=self_cache)
#     if k == 1:
#         y = self.cross_attn_residual(y, self.cross_attn, memory, mask=cross_mask, cache=cross_cache)
#     else:  # a sentence's k beams meet its one memory row together
#         b, t, d = y.shape
#         y = self.cross_attn_residual(y.reshape(b // k, k * t, d), self.cross_attn, memory, mask=cross_mask,
#                                      cache=cross_cache).reshape(b, t, d)
#     return self.ffn_residual(y, self.ffn)


class DecoderLayer(NumformerDecoderLayer):
    """numformer's DecoderLayer (its __init__, forward and children), with your backward."""

    def backward(self, dy):
        """Return (dL/dy (B, T, d_model), dL/dmemory (B, S, d_model)), the gradients of the layer's
        input and of the encoder's output, from dy (B, T, d_model), the gradient of the layer's
        output."""
        g = dy
        d_memory = None
        for res, sub in ((self.ffn_residual, self.ffn), (self.cross_attn_residual, self.cross_attn),
                         (self.self_attn_residual, self.self_attn)):
            out = res.backward(g, sub)
            g, *mem = out if isinstance(out, tuple) else (out,)
            if mem:
                (d_memory,) = mem
        return g, d_memory
