"""Exercise: the backward of an encoder layer (Section 3.1, Figure 1 left)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.finite_differences import GradCase
from numformer.model import EncoderLayer

from ..cases import B, S, D, _replay, padded_batch, small_config
from ..exercise import Exercise


def sublayers_in_forward_order(self, dy):
    """The sub-layers run backward in forward's order: the feed-forward came last, so its backward comes first."""
    dx = self.self_attn_residual.backward(dy, self.self_attn)
    return self.ffn_residual.backward(dx, self.ffn)


def feed_forward_skipped(self, dy):
    """The feed-forward sub-layer's backward is skipped: its parameters get no gradient and dy never passes through it."""
    return self.self_attn_residual.backward(dy, self.self_attn)


def attention_skipped(self, dy):
    """The self-attention sub-layer's backward is skipped: the input's gradient must come back through both sub-layers."""
    return self.ffn_residual.backward(dy, self.ffn)


def cases(cls, seed):
    rng = np.random.default_rng(seed)
    _, _, src_mask, _ = padded_batch(rng)
    out = []
    for pre in (False, True):
        rs = RandomState(seed + 11)
        m = cls(small_config(pre_norm=pre, dropout=0.1), rng, rs, np.float64)
        out.append(GradCase("EncoderLayer", f"{'pre' if pre else 'post'}-LN, padding, dropout 0.1 replayed", m,
                            {"x": rng.standard_normal((B, S, D))}, lambda m, i: m(i["x"], src_mask),
                            lambda m, g: {"x": m.backward(g[0])}, before_forward=_replay(rs)))
    return out


EXERCISE = Exercise(
    stage="composition", rank=1,  # composes the multi-head attention and the residual sub-layer
    name="encoder_layer", title="the backward of an encoder layer", paper="Section 3.1, Figure 1",
    target=EncoderLayer.backward, layer=EncoderLayer, cases=cases, show=(EncoderLayer.forward,),
    doc="dy (B, S, d_model) -> dx (B, S, d_model): Figure 1's encoder layer run backwards.",
    mistakes=(sublayers_in_forward_order, feed_forward_skipped, attention_skipped), swap="EncoderLayer",
    notes="The children: self.self_attn_residual and self.ffn_residual (Residual: backward(dy, sublayer), the "
          "residual exercise), around self.self_attn and self.ffn.",
    forward="""
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
        (the previous exercise), around self.self_attn and self.ffn. A Residual's backward(g, sublayer) takes
        g, the gradient of that residual's output, and the same sublayer its forward wrapped, and returns the
        gradient of that residual's input a (B, S, d_model): its skip path, LayerNorm, dropout and the
        sublayer's backward are all inside, and it adds every parameter gradient it reaches (LayerNorm,
        attention, feed-forward) into their .grad itself (accumulated). Each child's backward uses what its
        forward cached, once: call each exactly once. Return dx = dL/dx (B, S, d_model).""",
    returns="Return dL/dx (B, S, d_model), the gradient of the encoder layer's input, from dy = dL/dy (B, S, "
            "d_model), the gradient of its output.",
    steps=("The layer is a composition of two functions: y = R2(R1(x)), R1 the self-attention residual and R2 "
           "the feed-forward residual. By the chain rule the gradient of a composition is the last function's "
           "backward first: dL/dx = R1'(R2'(dy)), where F'(g) means F's backward applied to g. The backward "
           "runs the children in the reverse order of the forward.",
           "The feed-forward residual ran last, so its backward comes first: the ffn residual's backward on dy, "
           "given self.ffn (the sublayer it wrapped), returns dh (B, S, d_model), the gradient of the first "
           "residual's output. It has already added the feed-forward network's and its LayerNorm's parameter "
           "gradients.",
           "Then the self-attention residual's backward on dh, given self.self_attn, returns dx. Nothing to add: "
           "x reaches y only through R1 (its skip path is inside R1's backward), and the mask has no gradient. "
           "The whole backward: dh = self.ffn_residual.backward(dy, self.ffn); return "
           "self.self_attn_residual.backward(dh, self.self_attn). Each residual gets its own sublayer, and "
           "skipping either one leaves its parameters without a gradient."))
