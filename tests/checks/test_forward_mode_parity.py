"""Forward mode against PyTorch: every layer's JVP, and the tangent of its backward (Pearlmutter's R-operator),
against PyTorch's double backward on the mirror of tests/checks/test_torch_parity.py, in float64, on every case of
that file (padding, fully masked rows, dropout replayed, Marian's pad-row rule and start from pad) and at the
training sizes (the small preset's batch, base's layer shapes).

numformer: with random tangents for every parameter and float input (``numformer.forward_mode.tangents``), one
forward, ``jvp`` (the outputs' tangents) and ``backward_jvp`` from random upstream gradients G and their random
tangent G_dot (every input's gradient tangent, every ``Parameter.grad_tangent``).

PyTorch, by double backward and nothing of numformer's:

* the JVP ``J t`` by the transpose trick: ``g(u) = d<f, u>/dz = J^T u`` is linear in u, so ``J t = d<g(u), t>/du``;
* the R-op ``H_G t + J^T G_dot``: the gradient of ``<f, G>`` taken with ``create_graph``, then the gradient of its
  product with t (the Hessian-vector product), plus the gradient of ``<f, G_dot>``.

Each tensor agrees to ``norm(a - b) / norm(b)`` under 1e-10 (issue 70's bound); a tensor whose exact value is zero
(the key bias's gradient and its tangent: the softmax does not see a shift of a row's scores) agrees to 1e-12 of
its weight's in absolute terms. A planted bug in each kind of term fails (test_a_planted_bug_fails_parity).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from numformer.forward_mode import tangents
from numformer.kernels import kernel_mode
from numformer.layers import layernorm as layernorm_module
from numformer.layers import attention as attention_module
from numformer.layers import linear as linear_module
from numformer.layers import silu as silu_module
from numformer import loss as loss_module
from grad_checks.cases import Holder

from test_torch_parity import CASES, REAL_CASES, ZERO_GRAD_SUFFIXES, _LossHolder, mirror_params, recorded_decisions

TOL = 1e-10
ZERO_ATOL = 1e-12


# -- numformer's forward mode on a parity case -----------------------------------------------------------------

def _by_name(names, pair):
    grads, dots = pair
    grads, dots = (grads, dots) if isinstance(grads, tuple) else ((grads,), (dots,))
    return dict(zip(names, dots))


def nf_jvp(case, m, t, out):
    """{output: its tangent}, after case.nf_forward, the parameters' tangents set."""
    if case.criterion is not None:  # a whole model + loss: the logits' tangent, then the loss's
        logits_dot = m.jvp()
        return {"logits": logits_dot, "loss": case.criterion.jvp(logits_dot)}
    if isinstance(m, _LossHolder):
        return {"loss": m.crit.jvp(t["logits"])}
    if isinstance(m, Holder) and hasattr(m, "res"):
        return {"y": m.res.jvp(t["x"], m.ffn)}
    if isinstance(m, Holder):  # one learned table, two uses
        return {"sx": m.src.jvp(t["x"]), "ty": m.tgt.jvp(t["y"])}
    (name,) = out
    return {name: m.jvp(*(t[n] for n in case.inputs))}


def nf_backward_jvp(case, m, g, g_dot, out):
    """{input: its gradient's tangent}; every Parameter.grad_tangent filled."""
    if case.criterion is not None or isinstance(m, _LossHolder):
        crit = case.criterion if case.criterion is not None else m.crit
        dz, dz_dot = crit.backward_jvp()
        dz, dz_dot = dz * g["loss"], dz_dot * g["loss"] + dz * g_dot["loss"]
        if case.criterion is not None:
            m.backward_jvp(dz, dz_dot)
            return {}
        return {"logits": dz_dot}
    if isinstance(m, Holder) and hasattr(m, "res"):
        return _by_name(("x",), m.res.backward_jvp(g["y"], g_dot["y"], m.ffn))
    if isinstance(m, Holder):
        return {**_by_name(("y",), m.tgt.backward_jvp(g["ty"], g_dot["ty"])),
                **_by_name(("x",), m.src.backward_jvp(g["sx"], g_dot["sx"]))}
    (name,) = out
    return _by_name(tuple(case.inputs), m.backward_jvp(g[name], g_dot[name]))


# -- PyTorch's double backward -------------------------------------------------------------------------------

def _grad(y, xs, **kw):
    """torch.autograd.grad, zeros where a leaf does not reach y (or y reaches none)."""
    if not y.requires_grad:
        return [torch.zeros_like(x) for x in xs]
    got = torch.autograd.grad(y, xs, allow_unused=True, **kw)
    return [torch.zeros_like(x) if d is None else d for x, d in zip(xs, got)]


def torch_forward_mode(case, P, tin, replay, t_leaves, seeded, g, g_dot):
    """(J t per output, the R-op per leaf) on the mirror, by double backward."""
    leaves = P.leaves() + list(tin.values())
    out = case.torch_forward(P, tin, replay)
    us = {k: torch.zeros_like(v, requires_grad=True) for k, v in out.items()}
    jt_u = _grad(sum((out[k] * us[k]).sum() for k in out), leaves, create_graph=True)
    jvp = dict(zip(us, _grad(sum((a * b).sum() for a, b in zip(jt_u, t_leaves)), list(us.values()))))

    out = case.torch_forward(P, tin, replay)
    grads = _grad(sum((out[k] * g[k]).sum() for k in seeded), leaves, create_graph=True)
    hvp = _grad(sum((a * b).sum() for a, b in zip(grads, t_leaves)), leaves, retain_graph=True)
    along_g_dot = _grad(sum((out[k] * g_dot[k]).sum() for k in seeded), leaves)
    return jvp, [a + b for a, b in zip(hvp, along_g_dot)]


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    nb = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / nb if nb else float(np.linalg.norm(a))


def run_forward_mode_parity(build, case_id: str) -> dict:
    """Build the case in float64, run numformer's forward mode and PyTorch's double backward; -> {what: error}
    with every error already asserted within its bound."""
    rng = np.random.default_rng(zlib.crc32(case_id.encode()))
    case = build(rng, np.float64)
    m = case.module
    m.train()
    m.zero_grad()
    inputs = {k: np.asarray(v, dtype=np.float64) for k, v in case.inputs.items()}
    params = dict(m.named_parameters())
    t_params = {n: rng.standard_normal(p.shape) for n, p in params.items()}
    t_inputs = {k: rng.standard_normal(v.shape) for k, v in inputs.items()}
    P = mirror_params(m)

    with tangents(m, t_params):
        out = case.nf_forward(m, inputs)
        seeded = case.seeded or tuple(out)
        g = {k: rng.standard_normal(np.shape(out[k])) for k in seeded}
        g_dot = {k: rng.standard_normal(np.shape(out[k])) for k in seeded}
        replay = recorded_decisions(m, dropout=case.record_dropout, relu=False)
        out_dot = {k: np.array(v) for k, v in nf_jvp(case, m, t_inputs, out).items()}
        in_dots = nf_backward_jvp(case, m, g, g_dot, out)
        grad_dots = {n: np.array(p.grad_tangent) for n, p in params.items()}
    assert set(in_dots) == set(inputs), f"input gradient tangents {sorted(in_dots)} != inputs {sorted(inputs)}"

    tin = {k: torch.tensor(v, requires_grad=True) for k, v in inputs.items()}
    t_leaves = [torch.tensor(np.ascontiguousarray(t_params[n].T) if n in P.linear_weights else t_params[n])
                for n in P.tensors] + [torch.tensor(t_inputs[k]) for k in tin]
    t_jvp, t_rop = torch_forward_mode(case, P, tin, replay, t_leaves, seeded,
                                      {k: torch.tensor(v) for k, v in g.items()},
                                      {k: torch.tensor(v) for k, v in g_dot.items()})
    t_rop_params = {n: P._to_numformer_layout(n, r) for n, r in zip(P.tensors, t_rop)}
    t_rop_inputs = dict(zip(tin, (r.numpy() for r in t_rop[len(P.tensors):])))

    errors, bad = {}, []
    for k in out:
        errors[f"jvp of output {k}"] = rel(out_dot[k], t_jvp[k].detach().numpy())
    for k in inputs:
        errors[f"R-op of input {k}"] = rel(in_dots[k], t_rop_inputs[k])
    for name in params:
        if name.endswith(ZERO_GRAD_SUFFIXES):  # zero in exact arithmetic: both must be round-off
            na, nb = float(np.linalg.norm(grad_dots[name])), float(np.linalg.norm(t_rop_params[name]))
            weight = name[: -len("bias")] + "weight"
            bound = ZERO_ATOL * max(1.0, float(np.linalg.norm(t_rop_params[weight])))
            if max(na, nb) > bound:
                bad.append(f"R-op of {name}: expected ~0, norms numformer {na:.3g} torch {nb:.3g} > {bound:.3g}")
            continue
        errors[f"R-op of {name}"] = rel(grad_dots[name], t_rop_params[name])
    bad += [f"{where}: rel {e:.3g} > {TOL}" for where, e in errors.items() if not e <= TOL]
    assert not bad, f"{case_id}: forward mode disagrees with PyTorch's double backward:\n  " + "\n  ".join(bad)
    return errors


@pytest.mark.parametrize("case_id", list(CASES))
def test_forward_mode_parity(case_id):
    """The tiny shapes of every parity case: the JVP of every output and the R-op of every tensor. (Forward mode is
    plain math whatever the switch says; the forward it reads runs the default kernels, as training does: the plain
    forward's parity is test_torch_parity's.)"""
    run_forward_mode_parity(CASES[case_id], case_id)


def small_preset_eight_sentences(rng, dt):
    """The small preset (3+3 layers, d_model 256, 4 heads, d_ff 1024, vocabulary 8,000, dropout 0.1) on 8 of the
    training batch's sentences of up to 41 and 39 tokens, one source all padding: double backward of the 64-sentence
    batch takes PyTorch a minute and a half on 2 cores, and measures nothing more."""
    from numformer.model import Transformer  # noqa: PLC0415
    from numformer.presets import get_preset  # noqa: PLC0415
    from test_torch_parity import PAD, SMALL, _model_case, _randomize, real_batch  # noqa: PLC0415
    cfg = get_preset("small", vocab_size=SMALL["vocab"], pad_id=PAD, max_len=64)
    src, tgt = real_batch(rng, 8, SMALL["src"], SMALL["tgt"], SMALL["vocab"])
    m = Transformer(cfg, seed=int(rng.integers(1 << 30)), dtype=dt)
    _randomize(m, rng, 0.1)
    return _model_case(cfg, m, src, tgt, record_dropout=True)


REAL = {name: REAL_CASES[name] for name in ("SDPA-small-shape-padding-empty-row", "MHA-cross-base-shape",
                                              "FeedForward-base-shape", "LayerNorm-base-shape",
                                              "DecoderLayer-base-shape-dropout", "Loss-small-shape-vocab-8000")}
REAL["Transformer-small-preset-8-sentences-dropout"] = small_preset_eight_sentences


@pytest.mark.parametrize("case_id", list(REAL))
def test_forward_mode_parity_at_training_sizes(case_id):
    """The small preset's training shapes (d_model 256, vocabulary 8,000) and base's layer shapes."""
    run_forward_mode_parity(REAL[case_id], case_id)


_layernorm_backward_jvp = layernorm_module.layernorm_backward_jvp  # the right ones, which planted bugs call
_attention_jvp = attention_module.attention_jvp

PLANTED = {
    # a term of the product rule dropped: x W_dot
    "Linear": ("Linear", linear_module, "linear_jvp",
               lambda x, w, x_dot, w_dot, b_dot: linear_module.matmul(x_dot, w) + (0 if b_dot is None else b_dot)),
    # r's tangent forgotten in the backward's tangent
    "LayerNorm": ("LayerNorm", layernorm_module, "layernorm_backward_jvp",
                  lambda dy, dy_dot, xhat, r, gamma, xhat_dot, r_dot, gamma_dot, parameters=True:
                  _layernorm_backward_jvp(dy, dy_dot, xhat, r, gamma, xhat_dot, 0 * r_dot, gamma_dot, parameters)),
    # a masked score's tangent not zeroed (a fully masked row then moves)
    "SDPA-fully-masked-row": ("SDPA-fully-masked-row", attention_module, "attention_jvp",
                              lambda q, k, v, p, pu, masked, scale, q_dot, k_dot, v_dot, dj=None:
                              _attention_jvp(q, k, v, p, pu, None, scale, q_dot, k_dot, v_dot, dj)),
    # SiLU's second derivative missing: the Gauss-Newton part alone
    "SiLU": ("SiLU", silu_module, "silu_backward_jvp",
             lambda dy, dy_dot, x, s, x_dot: dy_dot * (s + x * s * (1 - s))),
    # the loss's tangent without its token weights (padding counted)
    "Loss-eps0.1": ("Loss-eps0.1", loss_module, "smoothed_cross_entropy_backward_jvp",
                    lambda p, weight, z_dot: loss_module.softmax_jvp(z_dot, p)),
}


@pytest.mark.parametrize("which", list(PLANTED))
def test_a_planted_bug_fails_parity(which, monkeypatch):
    case_id, module, name, wrong = PLANTED[which]
    monkeypatch.setattr(module, name, wrong)
    with kernel_mode("plain"), pytest.raises(AssertionError, match="disagrees with PyTorch"):
        run_forward_mode_parity(CASES[case_id], case_id)
