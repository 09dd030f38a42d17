"""A compact eager PyTorch Transformer of the same shape as numformer's, for speed comparisons only.

Post-LN (``LayerNorm(x + Dropout(Sublayer(x)))``), sinusoidal positions, embeddings
scaled by sqrt(d_model), source/target embeddings and the pre-softmax projection tied
into one (vocab, d_model) matrix, dropout 0.1 on embeddings and sub-layer outputs,
masked attention scores replaced by -1e9 (``masked_fill``), label-smoothed
cross-entropy (``F.cross_entropy(label_smoothing=eps)``), Adam(betas=(0.9, 0.98),
eps=1e-9). Nothing here imports numformer. Used by ``bench/train_step.py``.
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
            scores = scores.masked_fill(~mask, -1e9)
        out = torch.softmax(scores, dim=-1) @ v
        return self.w_o(out.transpose(1, 2).reshape(b, tq, d))


class FFN(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        return self.w_2(F.relu(self.w_1(x)))


class EncLayer(nn.Module):
    def __init__(self, d, h, d_ff, p):
        super().__init__()
        self.attn, self.ffn = MHA(d, h), FFN(d, d_ff)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.p = p

    def forward(self, x, mask):
        x = self.n1(x + F.dropout(self.attn(x, x, mask), self.p, self.training))
        return self.n2(x + F.dropout(self.ffn(x), self.p, self.training))


class DecLayer(nn.Module):
    def __init__(self, d, h, d_ff, p):
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = MHA(d, h), MHA(d, h), FFN(d, d_ff)
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.p = p

    def forward(self, y, memory, self_mask, cross_mask):
        y = self.n1(y + F.dropout(self.self_attn(y, y, self_mask), self.p, self.training))
        y = self.n2(y + F.dropout(self.cross_attn(y, memory, cross_mask), self.p, self.training))
        return self.n3(y + F.dropout(self.ffn(y), self.p, self.training))


class TorchTransformer(nn.Module):
    """Same architecture as numformer.model.Transformer (post-LN, tied embeddings)."""

    def __init__(self, vocab, d, h, layers, d_ff, dropout=0.1, max_len=1024, pad_id=0):
        super().__init__()
        self.d, self.p, self.pad_id = d, dropout, pad_id
        self.embed = nn.Parameter(torch.randn(vocab, d) * d ** -0.5)
        self.register_buffer("pe", sinusoid_table(max_len, d))
        self.enc = nn.ModuleList(EncLayer(d, h, d_ff, dropout) for _ in range(layers))
        self.dec = nn.ModuleList(DecLayer(d, h, d_ff, dropout) for _ in range(layers))

    def _embed(self, ids):
        x = F.embedding(ids, self.embed) * math.sqrt(self.d) + self.pe[: ids.shape[1]]
        return F.dropout(x, self.p, self.training)

    def forward(self, src, tgt_in):
        src_mask = (src != self.pad_id)[:, None, None, :]
        t = tgt_in.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
        tgt_mask = causal & (tgt_in != self.pad_id)[:, None, None, :]
        x = self._embed(src)
        for layer in self.enc:
            x = layer(x, src_mask)
        y = self._embed(tgt_in)
        for layer in self.dec:
            y = layer(y, x, tgt_mask, src_mask)
        return y @ self.embed.t()


def make(vocab, d, h, layers, d_ff, dropout=0.1, lr=1e-4, seed=0):
    """(model, optimizer, loss_fn) for a training step; loss_fn(logits, target) -> scalar."""
    torch.manual_seed(seed)
    model = TorchTransformer(vocab, d, h, layers, d_ff, dropout)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               ignore_index=0, label_smoothing=0.1)

    return model, opt, loss_fn
