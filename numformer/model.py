"""The Transformer of Section 3 (Figure 1): encoder and decoder stacks and the full model.

Shapes: source ids (batch, S), target input ids (batch, T) -> logits (batch, T, vocab).
Each class has ``forward`` and a ``backward`` that calls its children's backward in
reverse order, so the code reads like Figure 1 run backwards.

Masks are boolean, True where attention is allowed:
source padding mask (B, 1, 1, S); target mask = causal (1, 1, T, T) AND target padding (B, 1, 1, T), where
position 0 of the decoder input, the start token, is never padding (:func:`decoder_self_mask`).
"""
from __future__ import annotations

import numpy as np

from .backend import RandomState, get_array_module
from .layers.kv_cache import DecoderCache, DecoderLayerCache
from .layers.registry import built, layer_class, registered
from .layers.sublayer import norm_from_config
from .module import Module
from .presets import ModelConfig


def padding_mask(ids, pad_id: int):
    """(B, L) ids -> (B, 1, 1, L) bool, True at real tokens (the keys a query may see)."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t: int, xp=np):
    """(1, 1, T, T) bool, True on and below the diagonal: position i sees positions <= i (Section 3.2.3)."""
    return xp.tril(xp.ones((t, t), dtype=bool))[None, None]


def decoder_self_mask(tgt_in, pad_id: int):
    """(B, T) decoder input ids -> (B, 1, T, T) bool: the causal mask AND the keys that are not padding, where
    position 0 always counts as a key.

    Position 0 holds the start token: BOS in numformer's vocabularies, which is never pad, and pad itself in
    Marian's (``decoder_start_token_id = pad_id``). Masking it as padding there would leave query 0 with no
    key at all (a fully masked row); so the start position is causal-only, and for a start token other than
    pad this is the plain ``causal_mask & padding_mask``. The cached decoder (:meth:`Transformer.decode_step`)
    masks nothing: every cached position is a real one, the start included."""
    xp = get_array_module(tgt_in)
    keys = tgt_in != pad_id
    keys[:, 0] = True
    return causal_mask(tgt_in.shape[1], xp) & keys[:, None, None, :]


@registered
class EncoderLayer(Module):
    """Self-attention and feed-forward, each in a residual sub-layer (Section 3.1, Figure 1 left)."""

    kinks = False  # composes its children (Module.kinks: the layer contract)

    def __init__(self, cfg: ModelConfig, rng, dropout_rng, dtype):
        super().__init__()
        self.self_attn = built("MultiHeadAttention", cfg, rng, dropout_rng, dtype)
        self.self_attn_residual = built("Residual", cfg, dropout_rng, dtype)
        self.ffn = built("FeedForward", cfg, rng, dropout_rng, dtype)
        self.ffn_residual = built("Residual", cfg, dropout_rng, dtype)

    def forward(self, x, mask):
        """x (B, S, d_model), mask (B, 1, 1, S) -> (B, S, d_model)."""
        x = self.self_attn_residual(x, self.self_attn, mask=mask)
        return self.ffn_residual(x, self.ffn)

    def backward(self, dy):
        dx = self.ffn_residual.backward(dy, self.ffn)
        return self.self_attn_residual.backward(dx, self.self_attn)

    def jvp(self, x_dot):
        """Forward mode: x_dot (B, S, d_model) -> the output's tangent."""
        return self.ffn_residual.jvp(self.self_attn_residual.jvp(x_dot, self.self_attn), self.ffn)

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot)."""
        dx, dx_dot = self.ffn_residual.backward_jvp(dy, dy_dot, self.ffn)
        return self.self_attn_residual.backward_jvp(dx, dx_dot, self.self_attn)


@registered
class DecoderLayer(Module):
    """Masked self-attention, encoder-decoder attention and feed-forward (Section 3.1, Figure 1 right)."""

    kinks = False  # composes its children (Module.kinks: the layer contract)

    def __init__(self, cfg: ModelConfig, rng, dropout_rng, dtype):
        super().__init__()
        self.self_attn = built("MultiHeadAttention", cfg, rng, dropout_rng, dtype)
        self.self_attn_residual = built("Residual", cfg, dropout_rng, dtype)
        self.cross_attn = built("MultiHeadAttention", cfg, rng, dropout_rng, dtype)
        self.cross_attn_residual = built("Residual", cfg, dropout_rng, dtype)
        self.ffn = built("FeedForward", cfg, rng, dropout_rng, dtype)
        self.ffn_residual = built("Residual", cfg, dropout_rng, dtype)

    def forward(self, y, memory, self_mask, cross_mask, cache: DecoderLayerCache | None = None):
        """y (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model).

        ``cache`` (incremental decoding, eval mode only, Section 6.1; None in training): this layer's
        :class:`~numformer.layers.kv_cache.DecoderLayerCache`. y is then the newest position (T = 1): the
        self-attention appends its keys/values to ``cache.self_attn`` (no mask: it sees every cached
        position), the encoder-decoder attention projects the memory into ``cache.cross_attn`` once.
        With ``cache.beam`` k > 1, y holds k hypotheses per sentence (row s*k + j, B = B' * k) and memory
        one row per sentence (B', S, d_model): the encoder-decoder attention takes each sentence's k
        queries together, y seen as (B', k*T, d_model) (queries attend independently, so this equals
        repeating the memory k times, with k times smaller caches).
        """
        self_cache, cross_cache, k = (None, None, 1) if cache is None else (cache.self_attn, cache.cross_attn,
                                                                            cache.beam)
        y = self.self_attn_residual(y, self.self_attn, mask=self_mask, cache=self_cache)
        if k == 1:
            y = self.cross_attn_residual(y, self.cross_attn, memory, mask=cross_mask, cache=cross_cache)
        else:  # a sentence's k beams meet its one memory row together
            b, t, d = y.shape
            y = self.cross_attn_residual(y.reshape(b // k, k * t, d), self.cross_attn, memory, mask=cross_mask,
                                         cache=cross_cache).reshape(b, t, d)
        return self.ffn_residual(y, self.ffn)

    def backward(self, dy):
        """dy (B, T, d_model) -> (dy_in (B, T, d_model), dmemory (B, S, d_model))."""
        dy = self.ffn_residual.backward(dy, self.ffn)
        dy, dmemory = self.cross_attn_residual.backward(dy, self.cross_attn)
        dy = self.self_attn_residual.backward(dy, self.self_attn)
        return dy, dmemory

    def jvp(self, y_dot, memory_dot):
        """Forward mode (training: no cache): y_dot (B, T, d_model), memory_dot (B, S, d_model) -> the output's
        tangent."""
        y_dot = self.self_attn_residual.jvp(y_dot, self.self_attn)
        y_dot = self.cross_attn_residual.jvp(y_dot, self.cross_attn, memory_dot)
        return self.ffn_residual.jvp(y_dot, self.ffn)

    def backward_jvp(self, dy, dy_dot):
        """-> ((dy_in, dmemory), (dy_in_dot, dmemory_dot))."""
        dy, dy_dot = self.ffn_residual.backward_jvp(dy, dy_dot, self.ffn)
        (dy, dmemory), (dy_dot, dmemory_dot) = self.cross_attn_residual.backward_jvp(dy, dy_dot, self.cross_attn)
        dy, dy_dot = self.self_attn_residual.backward_jvp(dy, dy_dot, self.self_attn)
        return (dy, dmemory), (dy_dot, dmemory_dot)


@registered
class Encoder(Module):
    """N encoder layers (Section 3.1); a pre-LN stack ends with a final norm (LayerNorm, or ``cfg.norm``'s)."""

    kinks = False  # composes its children (Module.kinks: the layer contract)

    def __init__(self, cfg: ModelConfig, rng, dropout_rng, dtype):
        super().__init__()
        self.layers = [layer_class("EncoderLayer")(cfg, rng, dropout_rng, dtype) for _ in range(cfg.layers)]
        self.final_norm = norm_from_config(cfg, dtype) if cfg.pre_norm else None

    def forward(self, x, mask):
        """x (B, S, d_model), mask (B, 1, 1, S) -> memory (B, S, d_model)."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x

    def backward(self, dy):
        if self.final_norm is not None:
            dy = self.final_norm.backward(dy)
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy

    def jvp(self, x_dot):
        """Forward mode: x_dot (B, S, d_model) -> memory_dot (B, S, d_model)."""
        for layer in self.layers:
            x_dot = layer.jvp(x_dot)
        return self.final_norm.jvp(x_dot) if self.final_norm is not None else x_dot

    def backward_jvp(self, dy, dy_dot):
        """-> (dx, dx_dot)."""
        if self.final_norm is not None:
            dy, dy_dot = self.final_norm.backward_jvp(dy, dy_dot)
        for layer in reversed(self.layers):
            dy, dy_dot = layer.backward_jvp(dy, dy_dot)
        return dy, dy_dot


@registered
class Decoder(Module):
    """N decoder layers (Section 3.1); a pre-LN stack ends with a final norm (LayerNorm, or ``cfg.norm``'s)."""

    kinks = False  # composes its children (Module.kinks: the layer contract)

    def __init__(self, cfg: ModelConfig, rng, dropout_rng, dtype):
        super().__init__()
        self.layers = [layer_class("DecoderLayer")(cfg, rng, dropout_rng, dtype) for _ in range(cfg.n_decoder_layers)]
        self.final_norm = norm_from_config(cfg, dtype) if cfg.pre_norm else None

    def forward(self, y, memory, self_mask, cross_mask, cache: DecoderCache | None = None):
        """y (B, T, d_model), memory (B, S, d_model) -> (B, T, d_model); ``cache`` (decoding) one
        :class:`~numformer.layers.kv_cache.DecoderLayerCache` per layer, see :meth:`DecoderLayer.forward`."""
        for i, layer in enumerate(self.layers):
            y = layer(y, memory, self_mask, cross_mask, None if cache is None else cache[i])
        return self.final_norm(y) if self.final_norm is not None else y

    def backward(self, dy):
        """-> (dy_in (B, T, d_model), dmemory (B, S, d_model)): the memory gradient sums over layers."""
        if self.final_norm is not None:
            dy = self.final_norm.backward(dy)
        dmemory = None
        for layer in reversed(self.layers):
            dy, dm = layer.backward(dy)
            if dmemory is None:
                dmemory = dm
            else:
                dmemory += dm  # dm is a fresh array per layer: sum in place
        return dy, dmemory

    def jvp(self, y_dot, memory_dot):
        """Forward mode: y_dot (B, T, d_model), memory_dot (B, S, d_model) -> the output's tangent."""
        for layer in self.layers:
            y_dot = layer.jvp(y_dot, memory_dot)
        return self.final_norm.jvp(y_dot) if self.final_norm is not None else y_dot

    def backward_jvp(self, dy, dy_dot):
        """-> ((dy_in, dmemory), (dy_in_dot, dmemory_dot)): the memory's gradient and its tangent sum over
        layers."""
        if self.final_norm is not None:
            dy, dy_dot = self.final_norm.backward_jvp(dy, dy_dot)
        dmemory = dmemory_dot = 0
        for layer in reversed(self.layers):
            (dy, dm), (dy_dot, dm_dot) = layer.backward_jvp(dy, dy_dot)
            dmemory, dmemory_dot = dmemory + dm, dmemory_dot + dm_dot
        return (dy, dmemory), (dy_dot, dmemory_dot)


# the stacks are layers a user's class may stand in for (numformer.swap): the model reads them from the registry


class Transformer(Module):
    """The encoder-decoder model of Figure 1 with tied embeddings (Section 3.4).

    Tied (the paper's shared vocabulary): source embedding, target embedding and
    the pre-softmax projection are one (vocab, d_model) matrix, listed once as
    ``src_embed.weight``. Untied: three matrices.

    Positions (Section 3.5): the sinusoids, or (``cfg.positional == "learned"``, Table 3 row E) one
    trained table per stack, ``src_pos.weight`` and ``tgt_pos.weight`` (max_len, d_model).

    What a Marian (opus-mt) model computes besides (numformer.presets.ModelConfig): the feed-forward
    activation (``cfg.activation``); ``cfg.logits_bias``: ``logits = h W^T + b`` with ``b`` the frozen
    ``final_logits_bias`` (vocab,), a persistent buffer (saved with the weights, never trained, zero until
    a model file sets it; :meth:`logits`); ``cfg.pad_row_gradient`` False: both embeddings give the pad row
    no gradient from their lookups (``Embedding(padding_idx=pad_id)``).

    Every parameter is a view into one buffer of all of them (:meth:`Module.parameter_buffer`), made here and
    after :meth:`Module.to`, so Adam, the gradient norm and the all-reduce of several processes are a few
    whole-buffer operations.

    Construction is deterministic in ``seed``: weights are drawn on the host with
    ``numpy.random.default_rng(seed)`` then cast to ``dtype``; dropout masks come
    from one :class:`RandomState` per model (``self.rng``), seeded from ``seed`` too.
    """

    kinks = False  # a scale and sums around its children (Module.kinks: the layer contract)

    def __init__(self, cfg: ModelConfig, seed: int = 0, dtype=np.float32):
        super().__init__()
        self.cfg = cfg
        init_rng = np.random.default_rng(seed)
        self.rng = RandomState(seed + 1)
        d, v = cfg.d_model, cfg.vocab_size
        padding_idx = None if cfg.pad_row_gradient else cfg.pad_id  # the pad row's gradient rule (Marian's)
        self.src_embed = layer_class("Embedding")(v, d, rng=init_rng, dtype=dtype, padding_idx=padding_idx)
        shared = self.src_embed.weight if cfg.tie_embeddings else None
        self.tgt_embed = layer_class("Embedding")(v, d, weight=shared, rng=init_rng, dtype=dtype,
                                                  padding_idx=padding_idx)
        positions_rng = np.random.default_rng([seed, 1])  # the learned tables' own stream: see _positions
        self.src_pos = self._positions(cfg, positions_rng, dtype)
        self.tgt_pos = self._positions(cfg, positions_rng, dtype)  # one table per stack when learned
        self.src_dropout = layer_class("Dropout")(cfg.dropout, self.rng)
        self.tgt_dropout = layer_class("Dropout")(cfg.dropout, self.rng)
        self.encoder = layer_class("Encoder")(cfg, init_rng, self.rng, dtype)
        self.decoder = layer_class("Decoder")(cfg, init_rng, self.rng, dtype)
        self.generator = layer_class("OutputProjection")(d, v, weight=shared, rng=init_rng, dtype=dtype)
        self.final_logits_bias = None
        if cfg.logits_bias:  # not trained, but part of the model file: a persistent buffer (numformer.module)
            self.register_buffer("final_logits_bias", np.zeros(v, dtype=dtype), persistent=True)
        self.parameter_buffer()  # every weight a view into one array, every gradient into another (llm.c's layout)

    @staticmethod
    def _positions(cfg: ModelConfig, rng, dtype):
        """One stack's positional layer (Section 3.5): the sinusoids, or with ``cfg.positional == "learned"``
        a trained (max_len, d_model) table of its own (Table 3 row E), drawn from ``rng``. That generator is
        seeded from the model's seed but is not the one the other weights come from, so every other weight
        equals that of the sinusoidal model of the same seed: row E differs from base in the positions alone."""
        if cfg.positional == "learned":
            return layer_class("LearnedPositionalEmbedding")(cfg.d_model, cfg.max_len, dtype, rng=rng)
        return layer_class("PositionalEncoding")(cfg.d_model, cfg.max_len, dtype)

    def _moved(self, xp) -> None:
        self.rng.to(xp)

    @property
    def xp(self):
        return get_array_module(self.src_embed.weight.data)

    # -- training --------------------------------------------------------------
    def encode(self, src):
        """src (B, S) ids -> (memory (B, S, d_model), src_mask (B, 1, 1, S))."""
        src = self.xp.asarray(src)  # host ids for a device model are moved (no-op otherwise)
        src_mask = padding_mask(src, self.cfg.pad_id)
        x = self.src_dropout(self.src_pos(self.src_embed(src)))
        return self.encoder(x, src_mask), src_mask

    def logits(self, h):
        """h (..., d_model) -> logits (..., vocab): the pre-softmax projection ``h W^T`` (Section 3.4), plus
        ``final_logits_bias`` when the model has one: ``logits = h W^T + b``. Training, validation and both
        searches (cached or not) get their logits here. b is frozen: backward passes dlogits to ``h W^T``
        unchanged and gives b nothing."""
        logits = self.generator(h)
        if self.final_logits_bias is not None:
            logits += self.final_logits_bias  # in place: the projection's fresh (..., vocab) array
        return logits

    def forward(self, src, tgt_in):
        """src (B, S), tgt_in (B, T) ids -> logits (B, T, vocab) (before the softmax)."""
        xp = get_array_module(self.src_embed.weight.data)
        tgt_in = xp.asarray(tgt_in)
        memory, src_mask = self.encode(src)
        tgt_mask = decoder_self_mask(tgt_in, self.cfg.pad_id)
        y = self.tgt_dropout(self.tgt_pos(self.tgt_embed(tgt_in)))
        h = self.decoder(y, memory, tgt_mask, src_mask)
        return self.logits(h)

    def backward(self, dlogits) -> None:
        """dlogits (B, T, vocab) -> None; fills every Parameter.grad (token ids have no gradient; the frozen
        logits bias gets none either)."""
        dh = self.generator.backward(dlogits)
        dy, dmemory = self.decoder.backward(dh)
        self.tgt_embed.backward(self.tgt_pos.backward(self.tgt_dropout.backward(dy)))
        dx = self.encoder.backward(dmemory)
        self.src_embed.backward(self.src_pos.backward(self.src_dropout.backward(dx)))

    def jvp(self):
        """Forward mode after a training forward: -> logits_dot (B, T, vocab), the logits' tangent along the
        parameters' (``Parameter.tangent``; numformer/forward_mode.py). Ids have no tangent, nor has the frozen
        logits bias."""
        memory_dot = self.encoder.jvp(self.src_dropout.jvp(self.src_pos.jvp(self.src_embed.jvp())))
        y_dot = self.tgt_dropout.jvp(self.tgt_pos.jvp(self.tgt_embed.jvp()))
        return self.generator.jvp(self.decoder.jvp(y_dot, memory_dot))

    def backward_jvp(self, dlogits, dlogits_dot) -> None:
        """dlogits and its tangent (B, T, vocab) -> None; fills every Parameter.grad, as :meth:`backward`, and
        every Parameter.grad_tangent, the gradient's tangent (for the loss's dlogits: ``H theta_dot``)."""
        dh, dh_dot = self.generator.backward_jvp(dlogits, dlogits_dot)
        (dy, dmemory), (dy_dot, dmemory_dot) = self.decoder.backward_jvp(dh, dh_dot)
        self.tgt_embed.backward_jvp(*self.tgt_pos.backward_jvp(*self.tgt_dropout.backward_jvp(dy, dy_dot)))
        dx, dx_dot = self.encoder.backward_jvp(dmemory, dmemory_dot)
        self.src_embed.backward_jvp(*self.src_pos.backward_jvp(*self.src_dropout.backward_jvp(dx, dx_dot)))

    # -- incremental decoding (eval mode) ---------------------------------------
    def new_decoder_caches(self, beam: int = 1) -> DecoderCache:
        """An empty key/value cache for every decoder layer, for :meth:`decode_step`; ``beam`` hypotheses
        per sentence (see :class:`~numformer.layers.kv_cache.DecoderCache`)."""
        return DecoderCache(len(self.decoder.layers), beam)

    def decode_step(self, tokens, memory, src_mask, cache: DecoderCache, position: int):
        """Logits for the next token given the newest input token (Section 6.1).

        tokens (B*beam,) ids at ``position`` (0 for the start token: BOS, or pad in Marian's vocabulary);
        memory (B, S, d_model), src_mask (B, 1, 1, S); ``cache`` from :meth:`new_decoder_caches`, updated
        in place -> logits (B*beam, vocab).
        Costs one position per call: earlier keys and values come from the cache. The decoder runs as in
        training (:meth:`Decoder.forward`, each layer's :meth:`DecoderLayer.forward` with its cache).

        ``cache.beam`` > 1: the rows are sentence-major groups of ``beam`` hypotheses (row s*beam + j)
        that share their sentence's memory row, which is not repeated: the encoder-decoder
        attention runs with the group's ``beam`` queries against one cached key/value set per
        sentence (a (beam, S) GEMM per head instead of ``beam`` GEMVs, and caches ``beam`` times smaller).
        """
        if self.training:
            raise RuntimeError("decode_step runs in eval mode: call model.eval() first")
        xp = self.xp
        tokens = xp.asarray(tokens)
        src_mask = None if src_mask is None else xp.asarray(src_mask)
        memory = xp.asarray(memory)
        y = self.tgt_pos(self.tgt_embed(tokens[:, None]), offset=position)
        return self.logits(self.decoder(y, memory, None, src_mask, cache))[:, 0, :]
