"""Per-sentence gradient statistics of every parameter, exact and streaming.

numformer's backward sees every sentence's contribution to a parameter's gradient before the sum over
the batch (numformer/layers/per_sentence_summands.py: the summands, as math). :class:`PerSentenceGradients` taps
the layers while one backward runs and reduces those summands as they come, so that per parameter
tensor it holds, over the sentences of the batch (of every batch, under gradient accumulation):

* ``sq_norms`` (sentences,): the squared L2 norm of each sentence's gradient ``|g_b|^2``;
* ``sum_sq`` (the parameter's shape): the per-element sum of squares ``sum_b g_b^2``, hence the
  per-element variance of the per-sentence gradients;
* ``total``: ``sum_b g_b``, which is the batch gradient: the loss divides by the batch's token count
  (Section 5.4), so the sentences' gradients add up to it.

Never batch x parameters in memory: dense summands (a Linear's ``x_b^T dy_b``, the projection's
``dlogits_b^T h_b``) are formed for a chunk of sentences at a time, sized so that a chunk holds at most
``budget`` numbers (at least one sentence); the tables' summands are their rows.

``elementwise=False`` keeps the squared norms only, which is what the noise scale needs
(numformer/training/gradient_noise_scale.py), at a fraction of the cost: a product's summand is never formed, its
norm comes from two (T, T) Gram matrices per sentence (numformer/layers/per_sentence_summands.py). ``sum_sq`` and
``total`` are then None, and ``grad_sq`` holds ``|sum_b g_b|^2`` instead, read from the parameters'
gradients when the last backward returns; the gradients must be zero when the block starts, so that
they hold the tapped sentences' sum (the trainer zeroes them in every update).

A parameter used several times (the tied vocabulary matrix: source lookup, target lookup, pre-softmax
projection, Section 3.4) gets the statistics of its *total* per-sentence gradient, not of each use:
``|A_b + S_b|^2 = |A_b|^2 + |S_b|^2 + 2 <A_b, S_b>``, with ``A_b`` the projection's dense summand and
``S_b`` the rows the lookups scatter. The cross term needs ``A_b`` on the rows sentence b looked up only,
so those rows are kept when the projection's backward runs (it runs first) and the lookups' rows when
theirs do; everything is reduced when the model's backward returns.

Switched on only when asked for: ``with PerSentenceGradients(model) as tap:`` installs a backward tap on
every layer that owns parameters and one on the model (:meth:`numformer.module.Module.tap`), removed at
the block's end. A layer's tap reads what the layer saved for its backward (``layer.saved``, the names
its docstring lists) before that backward runs (it frees them, and a fast kernel may reuse the buffers).

Five layers have a closed-form rule (numformer/layers/per_sentence_summands.py): Linear, LayerNorm, the
pre-softmax projection, the embedding and the learned positions. Any other layer that owns parameters
and has no children of its own (a normalisation or activation written later, a user's ``--swap``) gets
the general rule: its own backward run once per sentence, with the upstream gradient of that sentence
alone, on what it saved (every layer acts on each sentence alone and its parameter gradient is linear in
the upstream gradient); B backward calls of that layer instead of one, exact all the same.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..backend import get_array_module, read_scalars, scatter_add
from ..layers import Embedding, LayerNorm, LearnedPositionalEmbedding, Linear, OutputProjection
from ..module import Parameter
from ..layers.per_sentence_summands import (embedding_per_sentence, layernorm_per_sentence, linear_per_sentence,
                                   linear_sq_norms, positions_per_sentence, product_sq_norms, projection_on_rows,
                                   projection_per_sentence)

BUDGET = 1 << 22  # numbers in one chunk of dense per-sentence gradients (16 MiB in float32)


@dataclass
class SentenceGradients:
    """One parameter tensor's per-sentence statistics over the sentences seen (see the module docstring)."""

    sq_norms: object
    sum_sq: object = None
    total: object = None
    grad_sq: object = None  # |sum_b g_b|^2 (a 0-d array), in the norms-only mode

    @property
    def sentences(self) -> int:
        return int(self.sq_norms.shape[0])


class _Accumulator:
    """The running statistics of one parameter, and what its uses left for the current backward."""

    def __init__(self, p, uses, elementwise: bool):
        xp = get_array_module(p.data)
        self.p, self.uses, self.xp = p, uses, xp
        self.sum_sq = xp.zeros_like(p.data) if elementwise else None
        self.total = xp.zeros_like(p.data) if elementwise else None
        self.grad_sq = None
        self.done = []            # sq_norms of finished backwards
        self.sq = None            # (B,) of the current backward
        self.rows = {}            # use index -> (ids (B, K_u), rows (B, K_u, d)) of a table's use
        self.dense_at_rows = None  # (B, K, d): the dense summand on the rows the lookups touch
        self.dense_done = False

    @property
    def tied(self) -> bool:
        return len(self.uses) > 1


class PerSentenceGradients:
    """Per-sentence gradient statistics of every parameter of ``model``, over the backwards run inside
    ``with PerSentenceGradients(model) as tap:`` (:meth:`statistics` after it).

    ``budget``: the most numbers a chunk of dense per-sentence gradients holds; ``elementwise``: also the
    per-element sums of squares and the sum (else the squared norms only, see the module docstring).
    """

    def __init__(self, model, budget: int = BUDGET, elementwise: bool = True):
        self.model, self.budget, self.elementwise = model, int(budget), bool(elementwise)
        self.names = {id(p): name for name, p in model.named_parameters()}
        uses = {}
        self.taps = []
        for m in model.modules():
            for kind, attrs in self._layer_parameters(m):
                self.taps.append((m, kind))
                for attr in attrs:
                    p = getattr(m, attr)
                    if p is not None:
                        uses.setdefault(id(p), []).append((m, kind, attr))
        missing = [n for i, n in self.names.items() if i not in uses]
        if missing:
            raise ValueError(f"no per-sentence rule for the parameter {missing[0]}: its layer has children of its "
                             "own (the general rule runs a layer's backward alone)")
        self.acc = {}
        for name, p in model.named_parameters():
            acc = _Accumulator(p, uses[id(p)], self.elementwise)
            kinds = [kind for _, kind, _ in acc.uses]
            if "general" in kinds and len(kinds) > 1:
                raise ValueError(f"{name}: a parameter shared between layers is combined for the projection "
                                 f"and the lookups only, not {', '.join(kinds)}")
            if "projection" in kinds and (kinds.count("projection") > 1 or "positions" in kinds):
                raise ValueError(f"{name}: a tied matrix combines one pre-softmax projection with embedding "
                                 f"lookups, not {', '.join(kinds)}")
            self.acc[id(p)] = acc

    @staticmethod
    def _layer_parameters(m):
        """(kind, parameter attributes) of the layer ``m`` when it holds parameters of its own."""
        if isinstance(m, Linear):
            return [("linear", ("weight", "bias"))]
        if isinstance(m, LayerNorm):
            return [("layernorm", ("weight", "bias"))]
        if isinstance(m, OutputProjection):
            return [("projection", ("weight",))]
        if isinstance(m, Embedding):
            return [("embedding", ("weight",))]
        if isinstance(m, LearnedPositionalEmbedding):
            return [("positions", ("weight",))]
        own = tuple(name for name, value in vars(m).items() if isinstance(value, Parameter))
        if own and not any(True for _ in m.named_children()):
            return [("general", own)]
        return []

    # -- switching the taps on and off -----------------------------------------------------------------
    def __enter__(self):
        if not self.elementwise:
            params = [acc.p for acc in self.acc.values()]
            xp = get_array_module(params[0].grad)
            if any(read_scalars(xp, *[xp.abs(p.grad).max() for p in params])):
                raise ValueError("per-sentence norms read the batch gradient from the parameters' gradients: "
                                 "zero them before the block (model.zero_grad())")
        self._installed = contextlib.ExitStack()
        for m, kind in self.taps:
            self._installed.enter_context(m.tap(backward=self._tap(kind)))
        self._installed.enter_context(self.model.tap(backward=self._around_the_model))
        return self

    def __exit__(self, *exc):
        self._installed.close()
        return False

    def _tap(self, kind):
        """The backward tap of a layer of ``kind``: its summands reduced, then its own backward."""
        record = getattr(self, f"_{kind}")
        if kind == "general":  # the layer's own backward, run per sentence: it needs the backward and its arguments
            def tap(m, backward, dy, *args, **kwargs):
                record(m, dy, backward, *args, **kwargs)
                return backward(dy, *args, **kwargs)
        else:
            def tap(m, backward, dy, *args, **kwargs):
                record(m, dy)
                return backward(dy, *args, **kwargs)
        return tap

    def _around_the_model(self, model, backward, *args, **kwargs):
        self._begin()
        out = backward(*args, **kwargs)
        self._finish()
        return out

    # -- one backward ------------------------------------------------------------------------------------
    def _begin(self) -> None:
        for acc in self.acc.values():
            acc.sq, acc.rows, acc.dense_at_rows, acc.dense_done = None, {}, None, False

    def _sq(self, acc, batch: int):
        if acc.sq is None:
            acc.sq = acc.xp.zeros(batch, dtype=acc.p.data.dtype)
        return acc.sq

    def _chunks(self, batch: int, size: int):
        step = max(1, self.budget // max(1, size))
        return [slice(i, min(i + step, batch)) for i in range(0, batch, step)]

    def _dense(self, p, summands, sentences, batch: int) -> None:
        """Reduce the dense summands (c, *p.shape) of the sentences ``sentences`` (a slice of the batch's
        ``batch``) into p's statistics."""
        acc = self.acc[id(p)]
        squares = summands * summands
        self._sq(acc, batch)[sentences] += squares.sum(axis=tuple(range(1, summands.ndim)))
        if self.elementwise:
            acc.sum_sq += squares.sum(axis=0)
            acc.total += summands.sum(axis=0)

    def _norms(self, p, sq_norms, batch: int) -> None:
        """Add squared norms (B,) of p's summands (the norms-only mode)."""
        self._sq(self.acc[id(p)], batch)[...] += sq_norms

    def _linear(self, m, dy) -> None:
        x = m.saved["x"].reshape(*dy.shape[:-1], m.d_in)
        self._need_sentences(dy, "Linear")
        if not self.elementwise:
            dw, db = linear_sq_norms(x, dy)
            self._norms(m.weight, dw, dy.shape[0])
            if m.bias is not None:
                self._norms(m.bias, db, dy.shape[0])
            return
        for ch in self._chunks(dy.shape[0], m.weight.size):
            dw, db = linear_per_sentence(x[ch], dy[ch])
            self._dense(m.weight, dw, ch, dy.shape[0])
            if m.bias is not None:
                self._dense(m.bias, db, ch, dy.shape[0])

    def _layernorm(self, m, dy) -> None:
        self._need_sentences(dy, "LayerNorm")
        xhat = m.saved["xhat"].reshape(dy.shape)
        dgamma, dbeta = layernorm_per_sentence(xhat, dy)
        everyone = slice(0, dy.shape[0])
        self._dense(m.weight, dgamma, everyone, dy.shape[0])
        self._dense(m.bias, dbeta, everyone, dy.shape[0])

    def _projection(self, m, dlogits) -> None:
        self._need_sentences(dlogits, "OutputProjection")
        acc = self.acc[id(m.weight)]
        batch = dlogits.shape[0]
        ids = self._looked_up(acc, batch) if acc.tied else None
        h = m.saved["h"]
        if not self.elementwise:
            self._norms(m.weight, product_sq_norms(h, dlogits), batch)
            if ids is not None:
                acc.dense_at_rows = projection_on_rows(h, dlogits, ids)
            acc.dense_done = True
            return
        at_rows = []
        for ch in self._chunks(batch, m.weight.size):
            dw = projection_per_sentence(h[ch], dlogits[ch])
            self._dense(m.weight, dw, ch, batch)
            if ids is not None:
                at_rows.append(acc.xp.take_along_axis(dw, ids[ch][:, :, None], axis=1))
        if ids is not None:
            acc.dense_at_rows = acc.xp.concatenate(at_rows, axis=0)
        acc.dense_done = True

    def _embedding(self, m, dy) -> None:
        self._need_sentences(dy, "Embedding")
        self._rows(m, m.weight, *embedding_per_sentence(m.saved["ids"].reshape(dy.shape[:-1]), dy, m.scale,
                                                        m.padding_idx))

    def _positions(self, m, dy) -> None:
        self._need_sentences(dy, "LearnedPositionalEmbedding")
        self._rows(m, m.weight, *positions_per_sentence(m.saved["offset"], dy))

    def _general(self, m, dy, backward, *args, **kwargs) -> None:
        """Any other layer owning parameters: its own ``backward`` run on each sentence's upstream gradient
        alone (zero elsewhere), from what it saved, a chunk of sentences at a time; the parameters'
        gradients and the saved tensors are put back as they were, for the real backward that follows."""
        if dy.ndim < 2:
            raise ValueError(f"per-sentence gradients need (batch, ...) inputs; {type(m).__name__} got {dy.shape}")
        params = [p for _, p in self._owned(m)]
        saved, before = dict(m.saved), [p.grad.copy() for p in params]
        batch, xp = dy.shape[0], get_array_module(dy)
        one = xp.zeros_like(dy)
        for ch in self._chunks(batch, sum(p.size for p in params)):
            summands = [xp.empty((ch.stop - ch.start, *p.shape), dtype=p.grad.dtype) for p in params]
            for b in range(ch.start, ch.stop):  # the general rule's price: one backward per sentence
                for p in params:
                    p.grad[...] = 0
                one[b] = dy[b]
                m.save_for_backward(**saved)
                backward(one, *args, **kwargs)
                one[b] = 0
                for s, p in zip(summands, params):
                    s[b - ch.start] = p.grad
            for s, p in zip(summands, params):
                self._dense(p, s, ch, batch)
        for p, g in zip(params, before):
            p.grad[...] = g
        m.save_for_backward(**saved)

    def _owned(self, m):
        """(attribute, Parameter) of every parameter the layer ``m`` owns."""
        return [(attr, getattr(m, attr)) for _, attrs in self._layer_parameters(m) for attr in attrs
                if getattr(m, attr) is not None]

    def _rows(self, m, p, ids, rows) -> None:
        acc = self.acc[id(p)]
        use = next(i for i, (mm, _, _) in enumerate(acc.uses) if mm is m)
        if any(kind == "projection" for _, kind, _ in acc.uses) and not acc.dense_done:
            raise RuntimeError("numformer bug: a lookup of the tied matrix ran its backward before the projection")
        acc.rows[use] = (ids, rows)
        if not acc.tied:
            self._reduce_rows(acc)

    @staticmethod
    def _looked_up(acc, batch: int):
        """The ids every lookup of a tied matrix read in its forward, (B, K), in the order of the uses (the
        embedding keeps them on the weight's device)."""
        return acc.xp.concatenate([m.saved["ids"].reshape(batch, -1) for m, kind, _ in acc.uses if kind == "embedding"],
                                  axis=1)

    def _reduce_rows(self, acc) -> None:
        """The rows every lookup use left (and, for a tied matrix, the dense summand on those rows) reduced
        into the statistics: per sentence, rows of one id add up before they are squared."""
        xp = acc.xp
        order = sorted(acc.rows)
        ids = xp.concatenate([acc.rows[u][0] for u in order], axis=1)
        rows = xp.concatenate([acc.rows[u][1] for u in order], axis=1)
        batch, width, vocab = ids.shape[0], rows.shape[-1], acc.p.shape[0]
        keys = (xp.arange(batch)[:, None] * vocab + ids).reshape(-1)
        unique, where = xp.unique(keys, return_inverse=True)
        where = where.reshape(-1)
        summed = xp.zeros((unique.shape[0], width), dtype=rows.dtype)
        scatter_add(summed, where, rows.reshape(-1, width))
        sentence, row = unique // vocab, unique % vocab
        squares = summed * summed
        if acc.dense_at_rows is not None:
            dense = xp.zeros_like(summed)
            dense[where] = acc.dense_at_rows.reshape(-1, width)  # one id's rows of one sentence are equal
            squares = squares + 2.0 * dense * summed
        sq = self._sq(acc, batch)
        scatter_add(sq, sentence, squares.sum(axis=-1))
        if self.elementwise:
            scatter_add(acc.sum_sq, row, squares)
            scatter_add(acc.total, row, summed)
        acc.rows = {}

    @staticmethod
    def _need_sentences(dy, layer: str) -> None:
        if dy.ndim != 3:
            raise ValueError(f"per-sentence gradients need (batch, time, ...) inputs; {layer} got {dy.shape}")

    def _finish(self) -> None:
        for acc in self.acc.values():
            if acc.rows:
                self._reduce_rows(acc)
            if acc.sq is not None:
                acc.done.append(acc.sq)
                acc.sq = None
            acc.dense_at_rows = None
            if not self.elementwise:  # the gradient so far: the sum of every tapped sentence's (zero at the start)
                g = acc.p.grad.reshape(-1)
                acc.grad_sq = (g * g).sum()

    # -- the result ----------------------------------------------------------------------------------------
    def statistics(self) -> dict:
        """{parameter name: SentenceGradients} over every sentence of every backward run so far."""
        out = {}
        for i, acc in self.acc.items():
            xp = acc.xp
            sq = xp.concatenate(acc.done) if acc.done else xp.zeros(0, dtype=acc.p.data.dtype)
            out[self.names[i]] = SentenceGradients(sq, acc.sum_sq, acc.total, acc.grad_sq)
        return out
