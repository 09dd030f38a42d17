"""Exercise 15 of 18: the backward of an encoder layer (Section 3.1, Figure 1). Level: derive.

The forward: one encoder layer (Section 3.1, Figure 1 left), two sub-layers, each inside a residual
connection with its LayerNorm and dropout (the residual exercise), in this order:

    h = Residual_1(x, SelfAttn)    self.self_attn_residual(x, self.self_attn, mask=mask)
                                   SelfAttn = MultiHead(x, x, x), Section 3.2.2, padding mask
    y = Residual_2(h, FFN)         self.ffn_residual(h, self.ffn)
                                   FFN(h) = max(0, h W_1 + b_1) W_2 + b_2, Section 3.3

x, h and y are (B, S, d_model); mask (B, 1, 1, S) is True at the keys a query may see and has no
gradient. Residual_k(a, Sub) is LayerNorm(a + Dropout(Sub(a))) post-LN (the paper's form) or a +
Dropout(Sub(LayerNorm(a))) pre-LN (Xiong et al. 2020); both residuals share the form, and this layer
need not know which.

Your method is EncoderLayer.backward(self, dy), dy = dL/dy (B, S, d_model); the forward above ran
first, in training mode. The children: self.self_attn_residual and self.ffn_residual are Residuals
(the previous exercise), around self.self_attn and self.ffn. A Residual's backward(g, sublayer)
takes g, the gradient of that residual's output, and the same sublayer its forward wrapped, and
returns the gradient of that residual's input a (B, S, d_model): its skip path, LayerNorm, dropout
and the sublayer's backward are all inside, and it adds every parameter gradient it reaches
(LayerNorm, attention, feed-forward) into their .grad itself (accumulated). Each child's backward
uses what its forward cached, once: call each exactly once. Return dx = dL/dx (B, S, d_model).

Your part: derive the backward pass on paper from the forward above, then write the body of
EncoderLayer.backward below, replacing its `raise NotImplementedError`. The arrays are float64 when
graded and float32 in training; every line must work on both.

Stuck? One step of the derivation at a time (3 steps):

    python -m grad_checks hint bench/held_out_grading_6/answers/my_encoder_layer.py

Check it (finite differences and numformer's own backward on several inputs; when it is wrong,
the report says where, and names the mistake or the term when it can):

    python -m grad_checks check bench/held_out_grading_6/answers/my_encoder_layer.py

When it checks exact, train with it (every EncoderLayer numformer builds is yours):

    python3 train.py --task copy --preset tiny --max-steps 300 --swap EncoderLayer=bench/held_out_grading_6/answers/my_encoder_layer.py:EncoderLayer
    python3 train.py --corpus bible-en-es --preset small --max-steps 300 --swap EncoderLayer=bench/held_out_grading_6/answers/my_encoder_layer.py:EncoderLayer
"""

import numpy as np

from numformer.model import EncoderLayer as NumformerEncoderLayer

EXERCISE = "encoder_layer"  # what `python -m grad_checks check` grades this file as

# ---- done: the forward pass, and what calls your code (numformer's code as it is now; for reading) ----
#
# numformer.model.EncoderLayer.forward:
# def forward(self, x, mask):
#     """x (B, S, d_model), mask (B, 1, 1, S) -> (B, S, d_model)."""
#     x = self.self_attn_residual(x, self.self_attn, mask=mask)
#     return self.ffn_residual(x, self.ffn)


class EncoderLayer(NumformerEncoderLayer):
    """numformer's EncoderLayer (its __init__, forward and children), with your backward."""

    def backward(self, dy):
        """Return dL/dx (B, S, d_model), the gradient of the encoder layer's input, from dy = dL/dy
        (B, S, d_model), the gradient of its output."""
        d_mid = self.self_attn_residual.backward(dy, self.self_attn)
        return self.ffn_residual.backward(d_mid, self.ffn)
