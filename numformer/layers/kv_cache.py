"""The key/value cache of incremental decoding (multi-head attention, Section 3.2.2, decoded as in Section 6.1).

The decoder is auto-regressive: at step t it is fed only the newest token, and each of its
attentions needs the keys and values of positions it has already seen. They are kept here
instead of being recomputed from the whole prefix, so a step costs one position:

* masked self-attention appends the step's keys and values (rows, h, 1, d) to what earlier steps
  left (:meth:`KVCache.append`); the keys are those of positions <= t, so the causal mask of
  training is implicit and the step needs no mask;
* encoder-decoder attention projects the encoder memory once, at the first step, and reuses
  those keys and values at every later step (:meth:`KVCache.store`).

Shapes: k (rows, h, T, d_k), v (rows, h, T, d_v). For self-attention, rows = batch * beam, the
hypotheses sentence-major (hypothesis j of sentence s in row s*beam + j) and T the positions decoded
so far; for encoder-decoder attention, rows = batch (the beams of a sentence share its memory) and
T = S, the source length. Beam search reorders the rows (:meth:`KVCache.take_rows_`) when a beam
continues another beam's prefix or a finished sentence leaves the batch.

:class:`DecoderCache` holds one :class:`DecoderLayerCache` (a self-attention and an encoder-decoder
:class:`KVCache`) per decoder layer; ``DecoderLayer.forward`` takes its layer's, ``cache=None`` in
training. Everything goes through ``xp`` (numpy or cupy, the arrays' own module).
"""
from __future__ import annotations

from ..backend import get_array_module


def take_rows_(buf, index):
    """``buf[index]`` along axis 0 (beam search reordering the cached keys/values): in place (only rows
    whose source moved are copied) when ``index`` keeps the row count, a new array otherwise. Returns
    the result."""
    xp = get_array_module(buf)
    if index.shape[0] != buf.shape[0]:
        return buf[index]
    moved = xp.nonzero(index != xp.arange(index.shape[0]))[0]
    if moved.size:
        buf[moved] = buf[index[moved]]  # the right side is a copy: rows read before any is written
    return buf


class KVCache:
    """One attention's cached keys ``k`` (rows, h, T, d_k) and values ``v`` (rows, h, T, d_v).

    Appended to (self-attention: :meth:`append`, one step's positions at a time) or stored once
    (encoder-decoder attention: :meth:`store`, the projected memory). Appended keys/values live in
    (rows, h, capacity, d) buffers that double when full, so a step writes its one position instead
    of copying the whole prefix; ``k`` and ``v`` are views of their first T positions. ``len(cache)``
    is T (0 before the first step).
    """

    def __init__(self):
        self.k = None       # (rows, h, T, d_k) or None before the first step
        self.v = None       # (rows, h, T, d_v)
        self._kbuf = None   # (rows, h, capacity, d_k) growable buffers behind k and v (appended caches only)
        self._vbuf = None

    def __len__(self) -> int:
        """T, the number of cached positions."""
        return 0 if self.k is None else self.k.shape[2]

    @property
    def empty(self) -> bool:
        """Nothing cached yet (before the first decoding step)."""
        return self.k is None

    def append(self, k_new, v_new):
        """Append (rows, h, t, d) keys/values after the T cached positions -> the (rows, h, T + t, d) views so far."""
        xp = get_array_module(k_new)
        t_new = k_new.shape[2]
        n = len(self)
        if self._kbuf is None or n + t_new > self._kbuf.shape[2]:
            cap = max(2 * n, n + t_new, 16)
            b, h = k_new.shape[:2]
            new_k = xp.empty((b, h, cap, k_new.shape[3]), dtype=k_new.dtype)
            new_v = xp.empty((b, h, cap, v_new.shape[3]), dtype=v_new.dtype)
            if n:
                new_k[:, :, :n] = self.k
                new_v[:, :, :n] = self.v
            self._kbuf, self._vbuf = new_k, new_v
        self._kbuf[:, :, n: n + t_new] = k_new
        self._vbuf[:, :, n: n + t_new] = v_new
        self.k, self.v = self._kbuf[:, :, : n + t_new], self._vbuf[:, :, : n + t_new]
        return self.k, self.v

    def store(self, k, v):
        """Keep (rows, h, S, d) keys/values computed once (the projected encoder memory) -> (k, v)."""
        self.k, self.v = k, v
        return k, v

    def take_rows_(self, index) -> None:
        """Keep rows ``index`` (rows',) of the cache, in this order (beam search reordering).

        A permutation that keeps the row count is applied in place through the views, copying only
        the rows whose source changed and only their first T positions; a new row count takes new arrays.
        """
        if self.k is None:
            return
        index = get_array_module(self.k).asarray(index)
        if self._kbuf is None:  # stored keys/values
            self.k, self.v = take_rows_(self.k, index), take_rows_(self.v, index)
        elif index.shape[0] == self._kbuf.shape[0]:
            take_rows_(self.k, index)  # in place, through the views
            take_rows_(self.v, index)
        else:
            n = len(self)
            self._kbuf, self._vbuf = self._kbuf[index], self._vbuf[index]
            self.k, self.v = self._kbuf[:, :, :n], self._vbuf[:, :, :n]


class DecoderLayerCache:
    """One decoder layer's caches: ``self_attn`` and ``cross_attn`` (:class:`KVCache`), and ``beam``, the
    hypotheses per sentence: the self-attention cache has batch * beam rows (row s*beam + j), the
    encoder-decoder one batch rows, one per sentence, shared by its beams."""

    def __init__(self, beam: int = 1):
        self.beam = beam
        self.self_attn = KVCache()
        self.cross_attn = KVCache()


class DecoderCache:
    """The decoder's caches for incremental decoding: one :class:`DecoderLayerCache` per layer (``layers``).

    Built empty (``Transformer.new_decoder_caches(beam)``), filled by the first decoding step and grown
    by one position per step. The searches reorder it: :meth:`take_rows_` keeps rows of both caches
    (beam 1: a row is a sentence), :meth:`take_hypotheses_` rows of the self-attention caches (each new
    beam continues its parent's prefix), :meth:`take_sentences_` rows of the encoder-decoder caches
    (finished sentences leave).
    """

    def __init__(self, n_layers: int, beam: int = 1):
        self.beam = beam
        self.layers = [DecoderLayerCache(beam) for _ in range(n_layers)]

    def __getitem__(self, i: int) -> DecoderLayerCache:
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)

    def take_rows_(self, index) -> None:
        """Every cache keeps rows ``index`` (beam 1 only, where a row is a sentence: those still searching)."""
        if self.beam != 1:
            raise ValueError(f"take_rows_ reorders a beam-1 cache; this one has beam {self.beam}: "
                             "use take_hypotheses_ and take_sentences_")
        self.take_hypotheses_(index)
        self.take_sentences_(index)

    def set_beam(self, beam: int) -> None:
        """The self-attention rows now hold ``beam`` hypotheses per sentence (beam search's first step
        feeds one per sentence, then :meth:`take_hypotheses_` copies each into its ``beam`` extensions)."""
        self.beam = beam
        for layer in self.layers:
            layer.beam = beam

    def take_hypotheses_(self, rows) -> None:
        """The self-attention caches keep hypothesis rows ``rows`` (batch' * beam,), in this order."""
        for layer in self.layers:
            layer.self_attn.take_rows_(rows)

    def take_sentences_(self, index) -> None:
        """The encoder-decoder caches keep sentences ``index`` (batch',), in this order."""
        for layer in self.layers:
            layer.cross_attn.take_rows_(index)
