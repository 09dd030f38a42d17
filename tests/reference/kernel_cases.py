"""Real-size inputs for every fast kernel and the plain function it replaces (``numformer.kernels``).

``inputs(name, rng, size, dtype)`` builds the arguments of the plain function ``PLAIN[name]`` at
one of ``SIZES``: the ``small`` preset's training shape (64 sentences of about 40 tokens,
d_model 256, 4 heads, vocabulary 8,000), ``base``'s layer shapes (d_model 512, 8 heads, d_ff
2048) and a batch of one, with odd lengths, padding and a source row that is all padding (fully
masked attention rows). Shared by ``tests/kernels/test_kernels.py`` (fast equals plain) and
``bench/kernel_speed.py`` (what each fast kernel buys over its plain function).
"""
from __future__ import annotations

import numpy as np

from numformer.decoding.search import beam_candidates, greedy_pick
from numformer.layers.attention import attention_backward, attention_forward
from numformer.layers.embedding import embedding_backward
from numformer.layers.layernorm import layernorm_backward, layernorm_forward
from numformer.layers.linear import linear_backward, linear_forward
from numformer.layers.relu import relu_backward, relu_forward
from numformer.loss import smoothed_cross_entropy, smoothed_cross_entropy_backward
from numformer.model import causal_mask, padding_mask
from numformer.optim import adam_update

# (batch, source length, target length, d_model, heads, d_ff, vocab)
SIZES = {
    "small-train-shape": (64, 41, 39, 256, 4, 1024, 8000),
    "base-layer-shape": (8, 35, 29, 512, 8, 2048, 8000),
    "batch-of-one": (1, 57, 53, 512, 8, 2048, 8000),
}


def _masks(rng, b, s, t):
    """Source padding mask with row 7 (when there is one) all padding, and the causal target mask."""
    s_len = rng.integers(s // 3, s + 1, b)
    s_len[0] = s
    t_len = rng.integers(2, t + 1, b)
    t_len[0] = t
    if b > 7:
        s_len[7] = 0
    src = np.where(np.arange(s)[None] < s_len[:, None], 5, 0)
    tgt = np.where(np.arange(t)[None] < t_len[:, None], 5, 0)
    return padding_mask(src, 0), causal_mask(t) & padding_mask(tgt, 0)


def _heads(rng, b, t, h, d, dt):
    """A (B, h, T, d) strided view of a (B, T, h*d) projection, as MultiHeadAttention passes it."""
    return rng.standard_normal((b, t, h * d)).astype(dt).reshape(b, t, h, d).transpose(0, 2, 1, 3)


def inputs(name, rng, size, dt):
    """Arguments of the plain function ``name`` at ``size``; arrays only where the call takes arrays."""
    b, s, t, d, h, dff, v = SIZES[size]
    n = b * s
    if name in ("attention_forward", "attention_backward"):
        src_mask, tgt_mask = _masks(rng, b, s, t)
        q, k, vv = _heads(rng, b, t, h, d // h, dt), _heads(rng, b, s, h, d // h, dt), _heads(rng, b, s, h, d // h, dt)
        scale = 1.0 / np.sqrt(d // h)
        if name == "attention_forward":
            return (q, k, vv, ~src_mask, scale)
        out, p, _ = attention_forward(q, k, vv, ~src_mask, scale)
        dout = rng.standard_normal(out.shape).astype(dt)
        return (dout, q, k, vv, p, p, ~src_mask, scale)
    if name == "attention_forward:causal":
        src_mask, tgt_mask = _masks(rng, b, s, t)
        q, k, vv = (_heads(rng, b, t, h, d // h, dt) for _ in range(3))
        return (q, k, vv, ~tgt_mask, 1.0 / np.sqrt(d // h))
    if name == "layernorm_forward":
        return (3 * rng.standard_normal((n, d)).astype(dt) + 1, 1 + rng.standard_normal(d).astype(dt),
                rng.standard_normal(d).astype(dt), 1e-5)
    if name == "layernorm_backward":
        x = 3 * rng.standard_normal((n, d)).astype(dt) + 1
        gamma = 1 + rng.standard_normal(d).astype(dt)
        _, xhat, r = layernorm_forward(x, gamma, np.zeros(d, dt), 1e-5)
        return (rng.standard_normal((n, d)).astype(dt), xhat, r, gamma)
    if name in ("linear_forward", "linear_backward"):
        # the feed-forward network's first map (d_model -> d_ff), the widest of the linear maps
        x, w = rng.standard_normal((n, d)).astype(dt), rng.standard_normal((d, dff)).astype(dt) / np.sqrt(d)
        if name == "linear_forward":
            return (x, w, rng.standard_normal(dff).astype(dt))
        return (rng.standard_normal((n, dff)).astype(dt), x, w, True)
    if name in ("relu_forward", "relu_backward"):
        # the feed-forward network's (B, S, d_ff) activations, some exactly 0 (ReLU's kink: not active)
        x = rng.standard_normal((b, s, dff)).astype(dt)
        x[:, :, ::97] = 0
        if name == "relu_forward":
            return (x,)
        return (rng.standard_normal((b, s, dff)).astype(dt), x > 0)
    if name == "embedding_backward":
        ids = rng.integers(1, v, n)
        ids[: n // 4] = 17  # many repeats of one id (a frequent token), as in real batches
        return (np.zeros((v, d), dt), ids, rng.standard_normal((n, d)).astype(dt), float(np.sqrt(d)))
    if name in ("smoothed_cross_entropy", "smoothed_cross_entropy:overwrite"):
        return (3 * rng.standard_normal((b * t, v)).astype(dt), rng.integers(0, v, b * t), 0.1, True,
                name.endswith("overwrite"))
    if name == "smoothed_cross_entropy_backward":
        z = 3 * rng.standard_normal((b * t, v)).astype(dt)
        y = rng.integers(0, v, b * t)
        _, _, p = smoothed_cross_entropy(z, y, 0.1)
        weight = (y % 5 != 0).astype(dt) / np.asarray(b * t, dtype=dt)   # some rows padding
        return (p, y, 0.1, weight)
    if name in ("adam_update", "adam_update:zero_grad"):
        shapes = [(v, d), (d, dff), (dff,), (d,), (dff, d)]   # embedding, W_1, biases, W_2 (some > one block)
        params = [rng.standard_normal(sh).astype(dt) for sh in shapes]
        grads = [rng.standard_normal(sh).astype(dt) for sh in shapes]
        ms = [0.1 * rng.standard_normal(sh).astype(dt) for sh in shapes]
        vs = [0.01 * rng.random(sh).astype(dt) for sh in shapes]
        return (params, grads, ms, vs, 1e-3 / (1 - 0.9 ** 3), 0.9, 0.98, np.sqrt(1 - 0.98 ** 3), 1e-9,
                name.endswith("zero_grad"))
    if name in ("beam_candidates", "greedy_pick"):
        m = b  # sentences, each with 4 beams; the decoder's logits over the vocabulary
        force = rng.random(m) < 0.2   # sentences whose length budget is spent: EOS forced
        force[0] = True
        if name == "greedy_pick":
            return (4 * rng.standard_normal((m, v)).astype(dt), 0, 1, 2, force)
        scores = np.log(rng.uniform(0.01, 1, (m, 4))).astype(dt)
        scores[-1, 1:] = -np.inf  # a sentence at its first step: only beam 0 is live
        return (4 * rng.standard_normal((m * 4, v)).astype(dt), scores, 8, 0, 1, 2, force)
    raise KeyError(name)


PLAIN = {
    "attention_forward": attention_forward, "attention_forward:causal": attention_forward,
    "attention_backward": attention_backward,
    "layernorm_forward": layernorm_forward, "layernorm_backward": layernorm_backward,
    "linear_forward": linear_forward, "linear_backward": linear_backward,
    "relu_forward": relu_forward, "relu_backward": relu_backward,
    "embedding_backward": embedding_backward,
    "smoothed_cross_entropy": smoothed_cross_entropy, "smoothed_cross_entropy:overwrite": smoothed_cross_entropy,
    "smoothed_cross_entropy_backward": smoothed_cross_entropy_backward,
    "adam_update": adam_update, "adam_update:zero_grad": adam_update,
    "beam_candidates": beam_candidates, "greedy_pick": greedy_pick,
}
