"""A PyTorch reference ("mirror") of numformer's layers and of the whole Transformer.

Written with torch ops and autograd only; nothing here calls numformer code, so it
is an independent second implementation of the paper (Vaswani et al. 2017):

* torch's own building blocks where their semantics match numformer's:
  ``F.linear``, ``F.embedding``, ``F.layer_norm``, ``torch.softmax``, ``F.relu``, and for another feed-forward
  activation the function of ``torch.nn.functional`` its row of numformer's activations table names (``F.silu``,
  ``F.gelu``: the table is read, numformer's code is not called), and for the residual sub-layers' norm the one
  its row of numformer's norms table names (``F.layer_norm``);
  ``F.cross_entropy(label_smoothing=eps)`` (eps spread as eps/V over all V classes,
  the same convention as numformer's loss);
* what a Marian (opus-mt) model computes besides, as PyTorch and transformers' ``MarianMTModel`` do it:
  ``F.silu`` in the feed-forward network; the pad row's gradient rule as ``F.embedding(padding_idx=pad)``;
  a frozen ``final_logits_bias`` added to the logits, a tensor without ``requires_grad`` (a buffer);
  a decoder input that starts with pad, whose start position is causal-only;
* its own sinusoid table (Section 3.5) and its own masks, built from the token ids; learned positions
  (Table 3 row E) as plain rows of a leaf tensor, ``P["src_pos.weight"][:T]``;
* masked attention scores are *replaced* by -1e9 (``masked_fill``), boolean masks
  True = attend, exactly the documented numformer semantics.

Parameters live in a :class:`MirrorParams`: float64 torch leaves with
``requires_grad=True`` keyed by numformer's dotted parameter names
(``encoder.layers.0.self_attn.w_q.weight``). numformer stores a Linear weight as
(d_in, d_out) (``y = x W + b``); the mirror keeps it in torch's (d_out, d_in)
layout for ``F.linear`` and transposes on the way in and on the way out.

What numformer decided by chance or by a sign can be replayed instead of decided again:
every function takes ``replay``, a dict from the numformer name of a module to what that
module decided in numformer's forward:

* a Dropout (``encoder.layers.0.ffn_residual.dropout``,
  ``decoder.layers.1.self_attn.attention.dropout``, ``src_dropout``): its mask, already
  scaled by 1/(1-p); a Dropout absent from ``replay`` is the identity;
* a ReLU (``encoder.layers.0.ffn.activation``): its active set [x > 0] as 0/1; a ReLU absent from
  ``replay`` decides for itself (``F.relu``). SiLU is smooth: nothing to replay.

The ReLU replay is for comparing numformer in float32 with this mirror in float64: a
pre-activation within float32's rounding error of zero can land on either side of it in the
two precisions, and then every gradient upstream of that unit differs by far more than the
rounding (a kink is a discontinuity of the derivative). Replayed, both take the same branch,
and the comparison measures numformer's arithmetic, not where a near-zero value fell.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from numformer.activations import ACTIVATIONS
from numformer.norms import NORMS

MASKED_SCORE = -1e9


class Arch:
    """The architecture the mirror reads: numformer's ModelConfig itself, each field under its own name (a field
    added to ModelConfig is read here with no change to this class), and the short names the mirror's functions
    use for five derived values: ``d_k`` and ``d_v`` the heads' widths (``head_dim_k``, ``head_dim_v``: resolved
    when the config leaves them unset), ``n_enc``, ``n_dec`` the stacks' depths, ``tie`` for ``tie_embeddings``."""

    def __init__(self, cfg):
        object.__setattr__(self, "cfg", cfg)

    @classmethod
    def from_config(cls, cfg) -> "Arch":
        """The mirror's view of ``cfg`` (a numformer ModelConfig; nothing is copied)."""
        return cls(cfg)

    def __getattr__(self, name):  # every field of the config (and its properties) by its own name
        if name == "cfg":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.cfg, name)

    def __setattr__(self, name, value):
        raise AttributeError("the mirror's Arch is read-only: change the ModelConfig it views")

    d_k = property(lambda self: self.cfg.head_dim_k)
    d_v = property(lambda self: self.cfg.head_dim_v)
    n_enc = property(lambda self: self.cfg.layers)
    n_dec = property(lambda self: self.cfg.n_decoder_layers)
    tie = property(lambda self: self.cfg.tie_embeddings)


class MirrorParams:
    """numformer parameter arrays as torch leaves (requires_grad=True), keyed by numformer's names.

    ``named_arrays``: (name, array) pairs in numformer layout, e.g. from
    ``[(n, p.data) for n, p in module.named_parameters()]``; ``linear_weights``: the
    names of Linear weights, stored here transposed to torch's (d_out, d_in). ``frozen``: (name, array)
    pairs of what the model holds but does not train (numformer's persistent buffers: a logits bias), kept
    as tensors without ``requires_grad``, read with :meth:`frozen`; autograd gives them nothing.
    """

    def __init__(self, named_arrays, linear_weights=(), dtype=torch.float64, frozen=()):
        self.linear_weights = set(linear_weights)
        self.constants = {name: torch.tensor(np.asarray(a, dtype=np.float64), dtype=dtype) for name, a in frozen}
        self.tensors: dict[str, torch.Tensor] = {}
        for name, a in named_arrays:
            a = np.asarray(a, dtype=np.float64)
            if name in self.linear_weights:
                a = a.T
            self.tensors[name] = torch.tensor(np.ascontiguousarray(a), dtype=dtype, requires_grad=True)
        unknown = self.linear_weights - set(self.tensors)
        if unknown:
            raise KeyError(f"linear weights not among the parameters: {sorted(unknown)}")

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str):
        return self.tensors.get(name)

    def frozen(self, name: str) -> torch.Tensor:
        """The frozen tensor ``name`` (no gradient). A KeyError when numformer did not give it as frozen: a
        numformer parameter of that name would be trained, which the model it mirrors never does."""
        if name not in self.constants:
            raise KeyError(f"{name} is not among the model's frozen tensors ({sorted(self.constants)}): "
                           f"{'numformer trains it as a parameter' if name in self.tensors else 'it is missing'}")
        return self.constants[name]

    def leaves(self) -> list:
        return list(self.tensors.values())

    def _to_numformer_layout(self, name: str, t) -> np.ndarray:
        a = t.detach().cpu().numpy()
        return np.ascontiguousarray(a.T) if name in self.linear_weights else a.copy()

    def grads(self) -> dict:
        """name -> gradient as a float64 numpy array in numformer's layout (zeros where unused)."""
        out = {}
        for name, t in self.tensors.items():
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            out[name] = self._to_numformer_layout(name, g)
        return out

    def values(self) -> dict:
        """name -> parameter value as a numpy array in numformer's layout."""
        return {name: self._to_numformer_layout(name, t) for name, t in self.tensors.items()}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def dropout(replay, name: str, x):
    """Replay numformer's mask for the Dropout called ``name`` (identity when none was recorded)."""
    if replay and name in replay:
        return x * replay[name]
    return x


def relu(replay, name: str, x):
    """max(0, x); with numformer's active set for the ReLU called ``name`` in ``replay``: x * that set,
    so the value and the gradient (the set) take numformer's branch at every kink."""
    if replay and name in replay:
        return x * replay[name]
    return F.relu(x)


def activation(replay, name: str, x, kind: str = "relu"):
    """The feed-forward network's activation: ReLU (replayed as :func:`relu`), or the function of
    ``torch.nn.functional`` the activations table names for ``kind`` (``F.silu``, ``F.gelu(approximate=...)``:
    smooth, nothing to replay)."""
    if kind not in ACTIVATIONS:
        raise ValueError(f"unknown activation {kind!r}")
    if kind == "relu":
        return relu(replay, name, x)
    row = ACTIVATIONS[kind]
    return getattr(F, row.torch)(x, **row.torch_kwargs)


# -- layers ------------------------------------------------------------------------

def linear(P, prefix: str, x):
    """y = x W^T + b in torch's layout (numformer's y = x W + b)."""
    return F.linear(x, P[_join(prefix, "weight")], P.get(_join(prefix, "bias")))


def embedding(P, prefix: str, ids, d_model: int, scale: bool = True, padding_idx=None):
    """Section 3.4: W[ids] * sqrt(d_model); ``padding_idx``: torch's rule, the lookups give that row no gradient."""
    out = F.embedding(ids, P[_join(prefix, "weight")], padding_idx=padding_idx)
    return out * math.sqrt(d_model) if scale else out


def output_projection(P, prefix: str, h):
    """Pre-softmax projection logits = h E^T with E (vocab, d_model), no bias."""
    return F.linear(h, P[_join(prefix, "weight")])


def sinusoid_table(length: int, d_model: int, dtype=torch.float64):
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / d_model)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)[:, : d_model // 2]
    return pe.to(dtype)


def positional(x, offset: int = 0):
    """x (B, T, d) + PE[offset : offset + T]."""
    t, d = x.shape[-2], x.shape[-1]
    return x + sinusoid_table(offset + t, d, x.dtype)[offset:]


def learned_positional(P, prefix: str, x, offset: int = 0):
    """Table 3 row (E): x (B, T, d) + P[offset : offset + T], the table the leaf ``prefix.weight`` (max_len, d);
    autograd's slice backward scatters the batch-summed gradient into those rows."""
    t = x.shape[-2]
    return x + P[_join(prefix, "weight")][offset: offset + t]


def positions(P, prefix: str, x, arch: Arch):
    """The stack's positions (``prefix`` src_pos or tgt_pos): the sinusoids, or the learned table."""
    return learned_positional(P, prefix, x) if arch.positional == "learned" else positional(x)


def layer_norm(P, prefix: str, x, eps: float):
    return F.layer_norm(x, (x.shape[-1],), P[_join(prefix, "weight")], P[_join(prefix, "bias")], eps)


def normalise(P, prefix: str, x, kind: str = "layernorm", eps: float = 1e-5):
    """The residual sub-layers' norm ``kind``: the function of ``torch.nn.functional`` its row of numformer's norms
    table names, ``F.<torch>(x, (d,), *the row's parameters, eps=eps)`` (``F.layer_norm`` for LayerNorm)."""
    if kind not in NORMS:
        raise ValueError(f"unknown norm {kind!r}")
    row = NORMS[kind]
    return getattr(F, row.torch)(x, (x.shape[-1],), *(P[_join(prefix, p)] for p in row.parameters), eps=eps)


def attention(q, k, v, mask=None, drop=None):
    """Eq. 1: softmax(Q K^T / sqrt(d_k)) V; masked scores replaced by -1e9; optional replayed dropout on P."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, MASKED_SCORE)
    p = torch.softmax(scores, dim=-1)
    if drop is not None:
        p = p * drop
    return p @ v


def multi_head(P, prefix: str, x, memory=None, mask=None, *, heads: int, d_k: int, d_v: int, replay=None):
    """Section 3.2.2; self-attention when memory is None, encoder-decoder attention otherwise."""
    kv = x if memory is None else memory
    b, tq, _ = x.shape
    tk = kv.shape[1]
    q = linear(P, _join(prefix, "w_q"), x).view(b, tq, heads, d_k).transpose(1, 2)
    k = linear(P, _join(prefix, "w_k"), kv).view(b, tk, heads, d_k).transpose(1, 2)
    v = linear(P, _join(prefix, "w_v"), kv).view(b, tk, heads, d_v).transpose(1, 2)
    drop = (replay or {}).get(_join(prefix, "attention.dropout"))
    o = attention(q, k, v, mask, drop)
    o = o.transpose(1, 2).reshape(b, tq, heads * d_v)
    return linear(P, _join(prefix, "w_o"), o)


def feed_forward(P, prefix: str, x, replay=None, kind: str = "relu"):
    """Eq. 2: max(0, x W1 + b1) W2 + b2 (ReLU active sets and ReLU dropout replayed when given); ``kind``
    another activation of the table ("silu", "gelu") in place of the ReLU."""
    h = activation(replay, _join(prefix, "activation"), linear(P, _join(prefix, "w_1"), x), kind)
    h = dropout(replay, _join(prefix, "dropout"), h)
    return linear(P, _join(prefix, "w_2"), h)


def residual(P, prefix: str, x, sublayer, *, pre_norm: bool, eps: float, replay=None, norm: str = "layernorm"):
    """Post-LN LN(x + Dropout(F(x))) or pre-LN x + Dropout(F(LN(x))); ``prefix`` names the residual; ``norm`` the
    norm of the table in LayerNorm's place."""
    name, drop = _join(prefix, "norm"), _join(prefix, "dropout")
    if pre_norm:
        return x + dropout(replay, drop, sublayer(normalise(P, name, x, norm, eps)))
    return normalise(P, name, x + dropout(replay, drop, sublayer(x)), norm, eps)


def encoder_layer(P, prefix: str, x, mask, arch: Arch, replay=None):
    kw = dict(heads=arch.heads, d_k=arch.d_k, d_v=arch.d_v, replay=replay)
    res = dict(pre_norm=arch.pre_norm, eps=arch.ln_eps, replay=replay, norm=arch.norm)
    x = residual(P, _join(prefix, "self_attn_residual"), x,
                 lambda h: multi_head(P, _join(prefix, "self_attn"), h, mask=mask, **kw), **res)
    return residual(P, _join(prefix, "ffn_residual"), x,
                    lambda h: feed_forward(P, _join(prefix, "ffn"), h, replay, arch.activation), **res)


def decoder_layer(P, prefix: str, y, memory, self_mask, cross_mask, arch: Arch, replay=None):
    kw = dict(heads=arch.heads, d_k=arch.d_k, d_v=arch.d_v, replay=replay)
    res = dict(pre_norm=arch.pre_norm, eps=arch.ln_eps, replay=replay, norm=arch.norm)
    y = residual(P, _join(prefix, "self_attn_residual"), y,
                 lambda h: multi_head(P, _join(prefix, "self_attn"), h, mask=self_mask, **kw), **res)
    y = residual(P, _join(prefix, "cross_attn_residual"), y,
                 lambda h: multi_head(P, _join(prefix, "cross_attn"), h, memory, mask=cross_mask, **kw), **res)
    return residual(P, _join(prefix, "ffn_residual"), y,
                    lambda h: feed_forward(P, _join(prefix, "ffn"), h, replay, arch.activation), **res)


def encoder(P, prefix: str, x, mask, arch: Arch, replay=None):
    for i in range(arch.n_enc):
        x = encoder_layer(P, _join(prefix, f"layers.{i}"), x, mask, arch, replay)
    return normalise(P, _join(prefix, "final_norm"), x, arch.norm, arch.ln_eps) if arch.pre_norm else x


def decoder(P, prefix: str, y, memory, self_mask, cross_mask, arch: Arch, replay=None):
    for i in range(arch.n_dec):
        y = decoder_layer(P, _join(prefix, f"layers.{i}"), y, memory, self_mask, cross_mask, arch, replay)
    return normalise(P, _join(prefix, "final_norm"), y, arch.norm, arch.ln_eps) if arch.pre_norm else y


# -- masks, model, loss ------------------------------------------------------------

def padding_mask(ids, pad_id: int):
    """(B, L) ids -> (B, 1, 1, L) bool, True at real tokens."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int):
    """(1, 1, T, T) bool, True on and below the diagonal."""
    return torch.ones(t, t, dtype=torch.bool).tril()[None, None]


def decoder_mask(tgt_in, pad_id: int):
    """(B, 1, T, T): causal AND (a real key OR the start position): the start token (BOS, or pad in Marian's
    vocabulary, transformers' decoder_start_token_id) is attended to whatever its id."""
    start = torch.zeros(tgt_in.shape[1], dtype=torch.bool)
    start[0] = True
    return causal_mask(tgt_in.shape[1]) & (padding_mask(tgt_in, pad_id) | start)


def transformer(P, src, tgt_in, arch: Arch, replay=None):
    """Figure 1: src (B, S), tgt_in (B, T) int64 ids -> logits (B, T, vocab)."""
    src_w = "src_embed"
    tgt_w = "src_embed" if arch.tie else "tgt_embed"
    gen_w = "src_embed" if arch.tie else "generator"
    src_mask = padding_mask(src, arch.pad_id)
    tgt_mask = decoder_mask(tgt_in, arch.pad_id)
    pad_row = None if arch.pad_row_gradient else arch.pad_id
    x = dropout(replay, "src_dropout",
                positions(P, "src_pos", embedding(P, src_w, src, arch.d_model, padding_idx=pad_row), arch))
    memory = encoder(P, "encoder", x, src_mask, arch, replay)
    y = dropout(replay, "tgt_dropout",
                positions(P, "tgt_pos", embedding(P, tgt_w, tgt_in, arch.d_model, padding_idx=pad_row), arch))
    h = decoder(P, "decoder", y, memory, tgt_mask, src_mask, arch, replay)
    logits = output_projection(P, gen_w, h)
    return logits + P.frozen("final_logits_bias") if arch.logits_bias else logits


def label_smoothed_loss(logits, target, eps: float, pad_id: int):
    """Mean over non-pad targets of cross-entropy against (1-eps) onehot + eps/V (PyTorch's convention)."""
    v = logits.shape[-1]
    target = target.reshape(-1)
    n_tokens = (target != pad_id).sum().clamp(min=1)
    total = F.cross_entropy(logits.reshape(-1, v), target, ignore_index=pad_id, reduction="sum",
                            label_smoothing=eps)
    return total / n_tokens
