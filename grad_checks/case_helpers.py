"""What every gradient check shares: the shapes, padded batches, configs and holders the cases are built from.

The checks run in float64 on B sentences of S source and T target tokens (model width D, HEADS heads, a
feed-forward width DFF, a vocabulary of V with PAD 0); :func:`padded_batch` gives the padding the cases
share (a source row all padding under a target row of real tokens: fully masked attention rows). Marian's
checks move pad to the last row (:data:`MARIAN_PAD`, :func:`as_marian_ids`) and hold its lookups
(:class:`HeldPadEmbedding`). The cases themselves: grad_checks/layer_cases.py (each layer alone) and
grad_checks/model_cases.py (layers, stacks, the whole model and Marian's); grad_checks/cases.py indexes them.
"""
from __future__ import annotations

import numpy as np

from numformer.backend import RandomState, get_array_module
from numformer.layers import Embedding
from numformer.model import causal_mask, padding_mask
from numformer.module import Module
from numformer.presets import ModelConfig

F64 = np.float64
B, S, T, D, HEADS, DFF, V = 3, 6, 5, 8, 4, 16, 13
PAD = 0


def padded_ids(rng, batch, length, lengths):
    """(batch, length) ids in 1..V-1, right-padded with PAD to the given per-row lengths."""
    ids = rng.integers(1, V, size=(batch, length))
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD
    return ids


def padded_batch(rng):
    """Source (B, S) and target (B, T) ids with padding, and the model's masks for them.

    Source row 2 is all padding: every key of it is masked, so its self-attention rows and
    the cross-attention rows of target row 2 (which has real tokens, so the loss sees them)
    are fully masked.
    """
    src = padded_ids(rng, B, S, [S, 4, 0])
    tgt = padded_ids(rng, B, T, [T, 3, 4])
    return src, tgt, padding_mask(src, PAD), causal_mask(T) & padding_mask(tgt, PAD)


#: layer name -> the builder of its cases, as each builder registers itself (:func:`checks`), in that order:
#: grad_checks/cases.py's BUILDERS, with the builders made from the tables' rows
REGISTERED: dict = {}


def checks(*names):
    """Register the decorated builder (``builder(rng) -> [GradCase]``) as the checks of the layers ``names``, where
    it is defined: a layer's checks are its builder, with no line in an index. Its inputs are seeded by its first
    name (grad_checks.cases.case_seed). Two builders for one name are a bug."""
    def register(builder):
        for name in names:
            if name in REGISTERED:
                raise ValueError(f"two grad-check builders for {name}: {REGISTERED[name].__name__} and "
                                 f"{builder.__name__}")
            REGISTERED[name] = builder
        return builder
    return register


def small_config(**kw) -> ModelConfig:
    """A 2-layer model config of the checks' dimensions, dropout off unless asked."""
    base = dict(vocab_size=V, d_model=D, d_ff=DFF, heads=HEADS, layers=2, dropout=0.0, max_len=32, pad_id=PAD)
    base.update(kw)
    return ModelConfig(**base)


class Holder(Module):
    """Groups modules so one check sees all their parameters (e.g. a Residual and its sub-layer)."""

    def __init__(self, **children):
        super().__init__()
        for k, v in children.items():
            setattr(self, k, v)


def _replay(rs: RandomState):
    """A before_forward hook that restores ``rs`` so every forward draws the same dropout masks."""
    state = rs.get_state()
    return lambda: rs.set_state(state)


def _by_name(names, pair) -> tuple:
    """A ``backward_jvp``'s (gradients, their tangents), each one array or a tuple in ``names``' order ->
    ({name: gradient}, {name: tangent})."""
    grads, dots = pair
    grads, dots = (grads, dots) if isinstance(grads, tuple) else ((grads,), (dots,))
    return dict(zip(names, grads)), dict(zip(names, dots))


def _merged(*pairs) -> tuple:
    """Several (gradients, tangents) dict pairs of :func:`_by_name` as one pair."""
    return {k: v for a, _ in pairs for k, v in a.items()}, {k: v for _, b in pairs for k, v in b.items()}


def forward_mode(*names, call=None, backward_call=None) -> dict:
    """The ``jvp`` and ``backward_jvp`` of a GradCase (numformer.finite_differences.tangent_checks) whose layer
    takes the float inputs ``names``, in that order: ``m.jvp(t[name], ...)`` and ``m.backward_jvp(g[0], g_dot[0])``,
    its results by name. ``call(m)`` / ``backward_call(m)``: the methods to call instead (a holder's child, with
    the sub-layer a Residual takes)."""
    call = call or (lambda m: m.jvp)
    backward_call = backward_call or (lambda m: m.backward_jvp)
    return dict(jvp=lambda m, t: call(m)(*(t[n] for n in names)),
                backward_jvp=lambda m, g, g_dot: _by_name(names, backward_call(m)(g[0], g_dot[0])))


def residual_forward_mode() -> dict:
    """The ``jvp`` and ``backward_jvp`` of a case of a Holder(res=Residual, ffn=its sub-layer) on input ``x``."""
    return forward_mode("x", call=lambda m: lambda x_dot: m.res.jvp(x_dot, m.ffn),
                        backward_call=lambda m: lambda dy, dy_dot: m.res.backward_jvp(dy, dy_dot, m.ffn))


def loss_forward_mode(crit, model=None) -> dict:
    """The ``jvp`` and ``backward_jvp`` of a case whose output is ``crit``'s loss (times 1.0, a float), of the
    logits input (``model`` None) or of ``model``'s logits (no input: a whole model + loss). The loss's upstream
    gradient g is a scalar, so the logits' gradient is ``dz * g`` and its tangent ``dz_dot * g + dz * g_dot``."""
    def jvp(m, t):
        return crit.jvp(t["logits"] if model is None else model.jvp()) * 1.0

    def backward_jvp(m, g, g_dot):
        dz, dz_dot = crit.backward_jvp()
        dz, dz_dot = dz * g[0], dz_dot * g[0] + dz * g_dot[0]
        if model is None:
            return {"logits": dz}, {"logits": dz_dot}
        model.backward_jvp(dz, dz_dot)
        return {}, {}
    return dict(jvp=jvp, backward_jvp=backward_jvp)


class HeldPadEmbedding(Embedding):
    """An Embedding whose lookups of ``padding_idx`` read that row as it was held (when built, or at
    :meth:`hold_pad_row`), whatever a probe does to the weight; its backward is the Embedding's, unchanged.

    The pad row's gradient rule (no gradient from its lookups) is the gradient of a forward whose pad lookups
    read a constant; where such a lookup reaches the loss (a decoder input starting with pad) the plain
    forward's derivative differs from the rule, by design (PyTorch's ``padding_idx``). Held like this, finite
    differences measure the rule: the row's lookups contribute nothing, its other uses (the tied projection)
    everything. As the curvature checks hold ReLU's active sets at the point.

    Built in place of the plain Embedding: directly, or in a whole model through
    ``numformer.layers.registry.replaced({"Embedding": HeldPadEmbedding})`` (the model's two embeddings)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.padding_idx is None:
            raise ValueError("a HeldPadEmbedding holds the row padding_idx: give one")
        self.hold_pad_row()

    def hold_pad_row(self) -> None:
        """Hold row ``padding_idx`` as it is now (again after weights are loaded into the layer's matrix)."""
        self.held_pad_row = self.weight.data[self.padding_idx].copy()

    def forward(self, ids):
        out = super().forward(ids)
        xp = get_array_module(out)  # ids and the held row on the layer's device (the GPU checks run these too)
        out[xp.asarray(ids) == self.padding_idx] = xp.asarray(self.held_pad_row) * self.scale
        return out


MARIAN_PAD = V - 1  # Marian keeps pad in the last row (eos 0): nothing may assume pad 0


def as_marian_ids(ids):
    """ids of the checks' vocabulary (PAD 0) with pad moved to the last row: 0 and V - 1 swap places."""
    return np.where(ids == PAD, MARIAN_PAD, np.where(ids == MARIAN_PAD, PAD, ids))
