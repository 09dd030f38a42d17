"""A compact eager PyTorch Transformer of the same shape as numformer's, for speed comparisons only.

Post-LN (``LayerNorm(x + Dropout(Sublayer(x)))``), sinusoidal positions, embeddings
scaled by sqrt(d_model), source/target embeddings and the pre-softmax projection tied
into one (vocab, d_model) matrix, dropout 0.1 on embeddings and sub-layer outputs,
masked attention scores replaced by the type's lowest value (``masked_fill``), label-smoothed
cross-entropy (``F.cross_entropy(label_smoothing=eps)``), Adam(betas=(0.9, 0.98),
eps=1e-9). Nothing here imports numformer. Used by ``bench/train_step.py`` and ``bench/gpu_train_step.py``.

Two attention variants, picked by ``make(..., variant=)``:

* ``plain``: separate Q/K/V ``nn.Linear`` maps, scores, ``masked_fill`` and ``torch.softmax`` written
  out, default ``torch.optim.Adam`` (the for-loop implementation);
* ``best``: what a PyTorch user would run for speed in eager mode: the Q/K/V maps fused into one
  (3d, d) in-projection as ``nn.MultiheadAttention`` does (Q and a fused (2d, d) K/V map for
  encoder-decoder attention), ``F.scaled_dot_product_attention`` with the boolean masks, and
  ``torch.optim.Adam(fused=True)`` (``foreach=True`` where the fused kernel is not available).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sinusoid_table(max_len: int, d_model: int) -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, i2 / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class MHA(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.dk = h, d // h
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, kv, mask):
        b, tq, d = x.shape
        tk = kv.shape[1]
        q = self.w_q(x).view(b, tq, self.h, self.dk).transpose(1, 2)
        k = self.w_k(kv).view(b, tk, self.h, self.dk).transpose(1, 2)
        v = self.w_v(kv).view(b, tk, self.h, self.dk).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dk))
        if mask is not None:
            # the most negative value of the scores' type: -1e9 overflows float16 under autocast (the first GPU run)
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.softmax(scores, dim=-1) @ v
        return self.w_o(out.transpose(1, 2).reshape(b, tq, d))


class FusedMHA(nn.Module):
    """Multi-head attention with one in-projection and ``F.scaled_dot_product_attention``."""

    def __init__(self, d, h):
        super().__init__()
        self.h, self.dk = h, d // h
        self.in_proj = nn.Linear(d, 3 * d)  # [W_Q; W_K; W_V] stacked, as nn.MultiheadAttention
        self.w_o = nn.Linear(d, d)

    def forward(self, x, kv, mask):
        b, tq, d = x.shape
        if kv is x:  # self-attention: one GEMM for Q, K and V
            q, k, v = self.in_proj(x).chunk(3, dim=-1)
        else:  # encoder-decoder attention: Q from x, K and V from the memory in one GEMM
            w, bias = self.in_proj.weight, self.in_proj.bias
            q = F.linear(x, w[:d], bias[:d])
            k, v = F.linear(kv, w[d:], bias[d:]).chunk(2, dim=-1)
        tk = k.shape[1]
        q = q.view(b, tq, self.h, self.dk).transpose(1, 2)
        k = k.view(b, tk, self.h, self.dk).transpose(1, 2)
        v = v.view(b, tk, self.h, self.dk).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.w_o(out.transpose(1, 2).reshape(b, tq, d))


class FFN(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        return self.w_2(F.relu(self.w_1(x)))


class EncLayer(nn.Module):
    def __init__(self, d, h, d_ff, p, attn=MHA):
        super().__init__()
        self.attn, self.ffn = attn(d, h), FFN(d, d_ff)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.p = p

    def forward(self, x, mask):
        x = self.n1(x + F.dropout(self.attn(x, x, mask), self.p, self.training))
        return self.n2(x + F.dropout(self.ffn(x), self.p, self.training))


class DecLayer(nn.Module):
    def __init__(self, d, h, d_ff, p, attn=MHA):
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = attn(d, h), attn(d, h), FFN(d, d_ff)
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.p = p

    def forward(self, y, memory, self_mask, cross_mask):
        y = self.n1(y + F.dropout(self.self_attn(y, y, self_mask), self.p, self.training))
        y = self.n2(y + F.dropout(self.cross_attn(y, memory, cross_mask), self.p, self.training))
        return self.n3(y + F.dropout(self.ffn(y), self.p, self.training))


class TorchTransformer(nn.Module):
    """Same architecture as numformer.model.Transformer (post-LN, tied embeddings)."""

    def __init__(self, vocab, d, h, layers, d_ff, dropout=0.1, max_len=1024, pad_id=0, attn=MHA):
        super().__init__()
        self.d, self.p, self.pad_id = d, dropout, pad_id
        self.embed = nn.Parameter(torch.randn(vocab, d) * d ** -0.5)
        self.register_buffer("pe", sinusoid_table(max_len, d))
        self.enc = nn.ModuleList(EncLayer(d, h, d_ff, dropout, attn) for _ in range(layers))
        self.dec = nn.ModuleList(DecLayer(d, h, d_ff, dropout, attn) for _ in range(layers))

    def _embed(self, ids):
        x = F.embedding(ids, self.embed) * math.sqrt(self.d) + self.pe[: ids.shape[1]]
        return F.dropout(x, self.p, self.training)

    def forward(self, src, tgt_in):
        src_mask = (src != self.pad_id)[:, None, None, :]
        t = tgt_in.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt_in.device).tril()[None, None]
        tgt_mask = causal & (tgt_in != self.pad_id)[:, None, None, :]
        x = self._embed(src)
        for layer in self.enc:
            x = layer(x, src_mask)
        y = self._embed(tgt_in)
        for layer in self.dec:
            y = layer(y, x, tgt_mask, src_mask)
        return y @ self.embed.t()


def fast_adam(params, **kw):
    """``Adam(fused=True)``, else ``Adam(foreach=True)`` where this build has no fused kernel for the
    parameters' device; returns (optimizer, "fused" or "foreach")."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kw), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.Adam(params, foreach=True, **kw), "foreach"


def make(vocab, d, h, layers, d_ff, dropout=0.1, lr=1e-4, seed=0, variant="plain", device="cpu"):
    """(model, optimizer, loss_fn) for a training step; loss_fn(logits, target) -> scalar.

    ``variant``: "plain" (separate Q/K/V, written-out softmax, default Adam) or "best" (fused
    in-projection, ``F.scaled_dot_product_attention``, fused Adam); see the module docstring.
    The model is moved to ``device`` before the optimizer is built (the fused Adam checks it).
    """
    if variant not in ("plain", "best"):
        raise ValueError(f"unknown variant {variant!r}: plain or best")
    torch.manual_seed(seed)
    model = TorchTransformer(vocab, d, h, layers, d_ff, dropout, attn=MHA if variant == "plain" else FusedMHA)
    model.to(device)
    model.train()
    kw = dict(lr=lr, betas=(0.9, 0.98), eps=1e-9)
    if variant == "plain":
        opt = torch.optim.Adam(model.parameters(), **kw)
    else:
        opt, _ = fast_adam(model.parameters(), **kw)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               ignore_index=0, label_smoothing=0.1)

    return model, opt, loss_fn
