"""Incremental decoding in PyTorch eager: numformer's searches re-written in torch, on numformer's weights.

The reference side of ``bench/decode.py``. A numformer model's weights are loaded into the
mirror's parameter layout (``torch_mirror.py`` beside this file: torch's (d_out, d_in) Linear weights) and a
decoder written the way a PyTorch user would write one for inference:

* ``torch.inference_mode``, weights as plain tensors of the chosen dtype;
* the self-attention Q/K/V maps as one (3d, d) ``F.linear`` (as ``nn.MultiheadAttention`` does),
  the encoder-decoder K/V maps as one (2d, d) ``F.linear`` run once per batch, before the first step;
* ``F.scaled_dot_product_attention`` (boolean mask, True = attend) for both attentions;
* a key/value cache per decoder layer that grows by ``torch.cat`` and is reordered with
  ``index_select`` (fairseq's incremental state); the encoder-decoder keys/values are re-selected
  only when finished sentences leave the batch (a beam permutation stays inside a sentence).

The searches follow :mod:`numformer.decoding.search` rule for rule (Section 6.1: beam 4, GNMT length
penalty with alpha 0.6, output at most a * source length + b tokens, EOS forced at the budget with its own log-probability,
fairseq's rule that an EOS ends a hypothesis only among the best ``beam`` candidates, a sentence
done once ``beam`` hypotheses ended, finished sentences leave the batch, in greedy search too) and use the same
length-sorted batches (:func:`numformer.decoding.translation._batches_by_length`), so that in float64 both
systems find the same hypotheses: a check of the search that is independent of numformer's code.
Nothing here runs numformer's layers or searches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .torch_mirror import Arch, sinusoid_table


@dataclass
class TorchHypothesis:
    tokens: list      # output ids without BOS and EOS
    logprob: float    # sum of log-probabilities, EOS included
    score: float      # logprob / length penalty


def length_penalty(length, alpha: float) -> float:
    """GNMT's ((5 + |Y|) / 6) ** alpha, |Y| counting the final EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def linear_weight_names(model) -> set:
    """Names of the Linear weights of a numformer model (the ones stored transposed in torch's layout)."""
    from numformer.layers import Linear  # noqa: PLC0415  (reads the checkpoint's module tree only)

    return {f"{n}.weight" if n else "weight" for n, mod in model.named_modules() if isinstance(mod, Linear)}


class TorchDecoder:
    """Encoder + cached decoder steps in torch, from numformer parameter arrays.

    ``named_arrays``: (name, array) in numformer's layout (``model.named_parameters()``);
    ``linear``: names of Linear weights; ``arch``: :class:`torch_mirror.Arch`; ``max_len``: positions.
    """

    def __init__(self, named_arrays, linear, arch: Arch, max_len: int, dtype=torch.float32):
        w = {}
        for name, a in named_arrays:
            a = np.asarray(a)
            w[name] = torch.tensor(np.ascontiguousarray(a.T if name in linear else a), dtype=dtype)
        self.arch, self.dtype, self.max_len = arch, dtype, max_len
        self.embed_src = w["src_embed.weight"]
        self.embed_tgt = w["src_embed.weight" if arch.tie else "tgt_embed.weight"]
        self.out_w = w["src_embed.weight" if arch.tie else "generator.weight"]
        if arch.positional == "learned":  # Table 3 row E: the model's own tables, one per stack
            self.pe_src, self.pe_tgt = w["src_pos.weight"], w["tgt_pos.weight"]
        else:
            self.pe_src = self.pe_tgt = sinusoid_table(max_len, arch.d_model, dtype)
        self.scale = math.sqrt(arch.d_model)

        def lin(prefix):
            return w[f"{prefix}.weight"], w.get(f"{prefix}.bias")

        def cat(prefixes):
            ws, bs = zip(*(lin(p) for p in prefixes))
            return torch.cat(ws, 0).contiguous(), (None if any(b is None for b in bs) else torch.cat(bs, 0))

        def norm(prefix):
            return w[f"{prefix}.weight"], w[f"{prefix}.bias"]

        self.enc = []
        for i in range(arch.n_enc):
            p = f"encoder.layers.{i}"
            self.enc.append(dict(qkv=cat([f"{p}.self_attn.w_{x}" for x in "qkv"]), o=lin(f"{p}.self_attn.w_o"),
                                 n1=norm(f"{p}.self_attn_residual.norm"), ff1=lin(f"{p}.ffn.w_1"),
                                 ff2=lin(f"{p}.ffn.w_2"), n2=norm(f"{p}.ffn_residual.norm")))
        self.dec = []
        for i in range(arch.n_dec):
            p = f"decoder.layers.{i}"
            self.dec.append(dict(qkv=cat([f"{p}.self_attn.w_{x}" for x in "qkv"]), o=lin(f"{p}.self_attn.w_o"),
                                 n1=norm(f"{p}.self_attn_residual.norm"),
                                 cq=lin(f"{p}.cross_attn.w_q"), ckv=cat([f"{p}.cross_attn.w_k", f"{p}.cross_attn.w_v"]),
                                 co=lin(f"{p}.cross_attn.w_o"), n2=norm(f"{p}.cross_attn_residual.norm"),
                                 ff1=lin(f"{p}.ffn.w_1"), ff2=lin(f"{p}.ffn.w_2"), n3=norm(f"{p}.ffn_residual.norm")))
        self.enc_final = norm("encoder.final_norm") if arch.pre_norm else None
        self.dec_final = norm("decoder.final_norm") if arch.pre_norm else None

    @classmethod
    def from_numformer(cls, model, dtype=torch.float32) -> "TorchDecoder":
        """From a numformer Transformer (its weights copied to the host, then to torch)."""
        from numformer.backend import to_host  # noqa: PLC0415

        arrays = [(n, to_host(p.data)) for n, p in model.named_parameters()]
        return cls(arrays, linear_weight_names(model), Arch.from_config(model.cfg), model.cfg.max_len, dtype)

    # -- building blocks ---------------------------------------------------------------
    def _heads(self, x):
        """(B, T, h*d) -> (B, h, T, d)."""
        b, t, _ = x.shape
        return x.view(b, t, self.arch.heads, -1).transpose(1, 2)

    def _merge(self, x):
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)

    def _residual(self, x, norm, sublayer):
        eps = self.arch.ln_eps
        if self.arch.pre_norm:
            return x + sublayer(F.layer_norm(x, x.shape[-1:], *norm, eps))
        return F.layer_norm(x + sublayer(x), x.shape[-1:], *norm, eps)

    def _ffn(self, layer, x):
        return F.linear(F.relu(F.linear(x, *layer["ff1"])), *layer["ff2"])

    # -- encoder -----------------------------------------------------------------------
    def encode(self, src):
        """src (B, S) int64 -> (memory (B, S, d), mask (B, 1, 1, S) bool, True = attend)."""
        mask = (src != self.arch.pad_id)[:, None, None, :]
        x = F.embedding(src, self.embed_src) * self.scale + self.pe_src[: src.shape[1]]

        def self_attn(layer, h):
            q, k, v = F.linear(h, *layer["qkv"]).chunk(3, dim=-1)
            o = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v), attn_mask=mask)
            return F.linear(self._merge(o), *layer["o"])

        for layer in self.enc:
            x = self._residual(x, layer["n1"], lambda h, layer=layer: self_attn(layer, h))
            x = self._residual(x, layer["n2"], lambda h, layer=layer: self._ffn(layer, h))
        if self.enc_final is not None:
            x = F.layer_norm(x, x.shape[-1:], *self.enc_final, self.arch.ln_eps)
        return x, mask

    # -- incremental decoder -------------------------------------------------------------
    def start(self, memory, mask) -> dict:
        """The decoding state: per layer the encoder-decoder keys/values (computed once) and an empty
        self-attention cache."""
        cross = []
        for layer in self.dec:
            k, v = F.linear(memory, *layer["ckv"]).chunk(2, dim=-1)
            cross.append((self._heads(k), self._heads(v)))
        return {"mask": mask, "cross": cross, "self": [None] * len(self.dec)}

    def step(self, tokens, position: int, state: dict):
        """tokens (N,) at ``position`` -> logits (N, V); the caches in ``state`` grow by one position."""
        y = (F.embedding(tokens[:, None], self.embed_tgt) * self.scale + self.pe_tgt[position])
        mask = state["mask"]
        for i, layer in enumerate(self.dec):
            def self_attn(h, i=i, layer=layer):
                q, k, v = (self._heads(t) for t in F.linear(h, *layer["qkv"]).chunk(3, dim=-1))
                if state["self"][i] is not None:
                    k = torch.cat([state["self"][i][0], k], dim=2)
                    v = torch.cat([state["self"][i][1], v], dim=2)
                state["self"][i] = (k, v)
                return F.linear(self._merge(F.scaled_dot_product_attention(q, k, v)), *layer["o"])

            def cross_attn(h, i=i, layer=layer):
                q = self._heads(F.linear(h, *layer["cq"]))
                k, v = state["cross"][i]
                return F.linear(self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), *layer["co"])

            y = self._residual(y, layer["n1"], self_attn)
            y = self._residual(y, layer["n2"], cross_attn)
            y = self._residual(y, layer["n3"], lambda h, layer=layer: self._ffn(layer, h))
        if self.dec_final is not None:
            y = F.layer_norm(y, y.shape[-1:], *self.dec_final, self.arch.ln_eps)
        return F.linear(y[:, 0], self.out_w)

    @staticmethod
    def reorder(state: dict, rows, sentences=None) -> None:
        """Self-attention caches take rows ``rows``; with ``sentences`` (kept rows of the batch, when
        finished sentences leave), the encoder-decoder keys/values and the mask follow."""
        state["self"] = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in state["self"]]
        if sentences is not None:
            state["cross"] = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in state["cross"]]
            state["mask"] = state["mask"].index_select(0, sentences)


def _limits(src, pad: int, a: float, b: int, cap: int):
    """Per-sentence output budget a * source length + b, in [1, cap] (host ints)."""
    n = (src != pad).sum(dim=1).numpy()
    return (a * n + b).astype(int).clip(min=1, max=cap)


def _log_probs(logits, pad: int, bos: int):
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, pad] = -math.inf
    logp[:, bos] = -math.inf
    return logp


def greedy(dec: TorchDecoder, src, bos: int, eos: int, a: float = 1.0, b: int = 50) -> list:
    """The most probable token at every step; src (B, S) -> B TorchHypothesis (score = logprob).
    Sentences that ended leave the batch (their rows of every cache are dropped)."""
    pad = dec.arch.pad_id
    n = src.shape[0]
    limits = torch.as_tensor(_limits(src, pad, a, b, dec.max_len))
    memory, mask = dec.encode(src)
    state = dec.start(memory, mask)
    active = list(range(n))
    history = torch.full((n, 1), bos, dtype=torch.long)
    logprob = torch.zeros(n, dtype=dec.dtype)
    hyps = [None] * n
    for t in range(int(limits.max())):
        logp = _log_probs(dec.step(history[:, -1], t, state), pad, bos)
        force = limits == t + 1
        eos_logp = logp[force, eos]  # forced EOS keeps the model's own log-probability (fairseq's rule)
        logp[force] = -math.inf
        logp[force, eos] = eos_logp
        gained, nxt = logp.max(dim=1)
        logprob += gained
        history = torch.cat([history, nxt[:, None]], dim=1)
        ended = nxt == eos
        if not bool(ended.any()):
            continue
        for r in ended.nonzero()[:, 0].tolist():
            lp = float(logprob[r])
            hyps[active[r]] = TorchHypothesis(history[r, 1:-1].tolist(), lp, lp)
        if bool(ended.all()):
            break
        stay = (~ended).nonzero()[:, 0]
        active = [active[i] for i in stay.tolist()]
        history, logprob, limits = history[stay], logprob[stay], limits[stay]
        dec.reorder(state, stay, stay)
    return hyps


def beam(dec: TorchDecoder, src, bos: int, eos: int, k: int = 4, alpha: float = 0.6, a: float = 1.0,
         b: int = 50) -> list:
    """Beam search, src (B, S) -> per sentence its best TorchHypothesis (numformer.decoding.search's rules)."""
    pad = dec.arch.pad_id
    n = src.shape[0]
    limits = torch.as_tensor(_limits(src, pad, a, b, dec.max_len))
    memory, mask = dec.encode(src)
    rep = torch.arange(n).repeat_interleave(k)  # sentence-major rows s*k + j
    state = dec.start(memory[rep], mask[rep])
    active = list(range(n))
    history = torch.zeros((n * k, 0), dtype=torch.long)
    last = torch.full((n * k,), bos, dtype=torch.long)
    scores = torch.full((n, k), -math.inf, dtype=dec.dtype)
    scores[:, 0] = 0.0
    finished = [[] for _ in range(n)]
    first_k = torch.arange(2 * k)[None, :] < k
    t = 0
    while active:
        m = len(active)
        logp = _log_probs(dec.step(last, t, state), pad, bos).view(m, k, -1)
        vocab = logp.shape[-1]
        force = limits == t + 1
        eos_logp = logp[force, :, eos]
        logp[force] = -math.inf
        logp[force, :, eos] = eos_logp
        top_scores, top = (scores[:, :, None] + logp).view(m, -1).topk(2 * k, dim=1)
        origin, token = top // vocab, top % vocab
        finite = torch.isfinite(top_scores)
        ends = (token == eos) & finite
        is_eos = ends & first_k
        if bool(is_eos.any()):
            penalty = length_penalty(t + 1, alpha)
            hist = history.view(m, k, -1)
            for r, c in is_eos.nonzero().tolist():
                s = active[r]
                if len(finished[s]) < k:
                    lp = float(top_scores[r, c])
                    finished[s].append(TorchHypothesis(hist[r, int(origin[r, c])].tolist(), lp, lp / penalty))
        alive = ~ends & finite
        rank = alive.cumsum(dim=1) - 1
        keep = alive & (rank < k)
        sort_key = torch.where(keep, rank, 2 * k + torch.arange(2 * k)[None, :])
        pick = sort_key.argsort(dim=1)[:, :k]
        new_scores = torch.where(keep, top_scores, torch.full_like(top_scores, -math.inf)).gather(1, pick)
        new_origin, new_token = origin.gather(1, pick), token.gather(1, pick)
        stay = [i for i, s in enumerate(active) if len(finished[s]) < k and not bool(force[i])]
        rows = (torch.arange(m)[:, None] * k + new_origin)
        sentence_rows = None
        if len(stay) < m:
            keep_idx = torch.as_tensor(stay, dtype=torch.long)
            rows, new_scores, new_token = rows[keep_idx], new_scores[keep_idx], new_token[keep_idx]
            limits = limits[keep_idx]
            sentence_rows = (keep_idx[:, None] * k + torch.arange(k)[None, :]).reshape(-1)
            active = [active[i] for i in stay]
        if not active:
            break
        rows = rows.reshape(-1)
        dec.reorder(state, rows, sentence_rows)
        history = torch.cat([history[rows], new_token.reshape(-1, 1)], dim=1)
        last = new_token.reshape(-1)
        scores = new_scores
        t += 1
    return [max(h, key=lambda x: x.score) if h else TorchHypothesis([], -math.inf, -math.inf) for h in finished]


def translate_ids(dec: TorchDecoder, src_ids: list, bos: int, eos: int, beam_size: int = 4, alpha: float = 0.6,
                  a: float = 1.0, b: int = 50, max_tokens: int = 4000) -> list:
    """Token-id sentences -> per sentence the best TorchHypothesis, in input order, searched in the
    same length-sorted batches as :func:`numformer.decoding.translation.translate_ids`."""
    from numformer.decoding.translation import _batches_by_length, source_batch  # noqa: PLC0415  (host batching only)

    if any(len(s) > dec.max_len - 1 for s in src_ids):
        raise ValueError("a sentence is longer than the positional table: the bench does not split lines")
    found = [None] * len(src_ids)
    lengths = np.array([len(s) + 1 for s in src_ids], dtype=np.int64)
    with torch.inference_mode():
        for idx in _batches_by_length(lengths, max(1, max_tokens)):
            src = torch.from_numpy(source_batch([src_ids[i] for i in idx], dec.arch.pad_id, eos))
            if beam_size <= 1:
                hyps = greedy(dec, src, bos, eos, a, b)
            else:
                hyps = beam(dec, src, bos, eos, beam_size, alpha, a, b)
            for i, h in zip(idx, hyps):
                found[i] = h
    return found
