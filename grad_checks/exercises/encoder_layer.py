"""Exercise: the backward of an encoder layer (Section 3.1, Figure 1 left)."""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState
from numformer.gradcheck import GradCase
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
    name="encoder_layer", title="the backward of an encoder layer", paper="Section 3.1, Figure 1",
    target=EncoderLayer.backward, layer=EncoderLayer, cases=cases, show=(EncoderLayer.forward,),
    doc="dy (B, S, d_model) -> dx (B, S, d_model): Figure 1's encoder layer run backwards.",
    mistakes=(sublayers_in_forward_order, feed_forward_skipped, attention_skipped), swap="EncoderLayer",
    notes="The children: self.self_attn_residual and self.ffn_residual (Residual: backward(dy, sublayer), the "
          "residual exercise), around self.self_attn and self.ffn.")
