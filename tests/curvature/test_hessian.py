"""Hessian-vector products of a block (numformer/curvature/hvp.py) and Lanczos (numformer/curvature/lanczos.py):
``H v`` by central differences of numformer's gradients agrees with ``torch.autograd.functional.hvp`` on the
PyTorch mirror (float64) within the error it states, for blocks of every kind (the tied vocabulary matrix,
LayerNorm, feed-forward, attention), post-LN and pre-LN; holding the ReLU active sets is what makes a large
step work (planted: not holding them fails); Lanczos's extreme eigenvalues equal ``eigh`` of a tiny block's
dense Hessian, and its quadrature reproduces ``z^T H z / n`` exactly."""
import contextlib
import sys
from pathlib import Path

import numpy as np
import pytest

from numformer.curvature.hvp import BlockHessian
from numformer.curvature.lanczos import density, extreme_eigenvalues, lanczos, ritz, slq
from numformer.kernels import kernel_mode
from numformer.model import Transformer
from numformer.presets import ModelConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {"tied post-LN": dict(), "untied pre-LN learned positions": dict(tie_embeddings=False, pre_norm=True,
                                                                            positional="learned")}
BLOCKS = {"tied post-LN": ["src_embed.weight", "encoder.layers.1.ffn_residual.norm.weight",
                           "decoder.layers.0.ffn.w_1.weight", "decoder.layers.1.cross_attn.w_q.weight"],
          "untied pre-LN learned positions": ["generator.weight", "decoder.final_norm.bias",
                                              "encoder.layers.0.self_attn.w_k.weight", "tgt_pos.weight"]}


def model_and_batch(name, **kw):
    cfg = ModelConfig(**{**dict(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32),
                         **CONFIGS[name], **kw})
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 13, (3, 6)), rng.integers(1, 13, (3, 6))
    src[1, 4:], tgt[2, 3:] = 0, 0
    return Transformer(cfg, seed=1, dtype=np.float64), cfg, (src, tgt[:, :-1], tgt[:, 1:])


def torch_hvp(model, cfg, batch, names, v):
    """``H v`` of the same loss and block on the PyTorch mirror, by double backpropagation."""
    torch = pytest.importorskip("torch")
    from reference import torch_mirror as tm
    from reference.torch_decode import linear_weight_names

    linear = linear_weight_names(model)
    mirror = tm.MirrorParams([(n, p.data) for n, p in model.named_parameters()], linear)
    arch = tm.Arch.from_config(cfg)
    params = {n: t.detach() for n, t in mirror.tensors.items()}
    src, tgt_in, tgt_out = (torch.as_tensor(a) for a in batch)

    def loss(*block):
        p = dict(params, **dict(zip(names, block)))
        return tm.label_smoothed_loss(tm.transformer(p, src, tgt_in, arch), tgt_out, arch.label_smoothing, 0)

    shapes = {n: p.shape for n, p in model.named_parameters()}
    parts, start = [], 0
    for n in names:
        k = int(np.prod(shapes[n]))
        a = v[start:start + k].reshape(shapes[n])
        parts.append(torch.tensor(np.ascontiguousarray(a.T) if n in linear else a))
        start += k
    _, hv = torch.autograd.functional.hvp(loss, tuple(params[n] for n in names), tuple(parts))
    return np.concatenate([(h.numpy().T if n in linear else h.numpy()).reshape(-1) for n, h in zip(names, hv)])


@pytest.mark.parametrize("name", CONFIGS)
def test_exact_hvp_agrees_with_torch_double_backward_to_rounding(name):
    """Forward over reverse (the default method) against PyTorch's double backward: 1e-10 of |H v|, the issue's
    bound, on blocks of every kind; the weights untouched."""
    model, cfg, batch = model_and_batch(name)
    names = BLOCKS[name]
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    rng = np.random.default_rng(1)
    hessian = BlockHessian(model, batch, names)
    assert hessian.method == "exact"
    for _ in range(2):
        v = rng.standard_normal(hessian.dim)
        mine, theirs = hessian(v), torch_hvp(model, cfg, batch, names, v)
        assert np.linalg.norm(mine - theirs) <= 1e-10 * np.linalg.norm(theirs)
    assert all(np.array_equal(p.data, before[n]) for n, p in model.named_parameters())
    assert hessian.evaluations == 2  # one pass with tangents a product


@pytest.mark.parametrize("name", CONFIGS)
def test_hvp_by_differences_agrees_with_torch_within_the_error_it_states(name):
    model, cfg, batch = model_and_batch(name)
    names = BLOCKS[name]
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    rng = np.random.default_rng(1)
    with kernel_mode("plain"):
        hessian = BlockHessian(model, batch, names, method="differences")
        for _ in range(2):
            v = rng.standard_normal(hessian.dim)
            mine, stated = hessian(v), hessian.error(v)
            theirs = torch_hvp(model, cfg, batch, names, v)
            actual = float(np.linalg.norm(mine - theirs))
            assert actual <= 10 * stated + 1e-12 * np.linalg.norm(theirs), (actual, stated)
            assert stated <= 1e-7 * np.linalg.norm(theirs)  # and the stated error is small
    assert all(np.array_equal(p.data, before[n]) for n, p in model.named_parameters())  # weights restored


def test_exact_hvp_in_float32_is_float32_rounding_and_differences_in_float32_far_worse():
    """The exact product of a float32 model agrees with float64's to float32's rounding (1e-5 of |H v| here); the
    differences of float32 gradients (allowed only when asked) carry errors a hundred times larger."""
    model, cfg, batch = model_and_batch("tied post-LN")
    names = BLOCKS["tied post-LN"]
    v = np.random.default_rng(2).standard_normal(BlockHessian(model, batch, names).dim)
    exact64 = BlockHessian(model, batch, names)(v)
    model32 = model_and_batch("tied post-LN")[0].to(dtype=np.float32)
    exact32 = BlockHessian(model32, batch, names)(v.astype(np.float32))
    diff32 = BlockHessian(model32, batch, names, method="differences", allow_float32=True)(v.astype(np.float32))
    assert exact32.dtype == np.float32
    err_exact = np.linalg.norm(exact32 - exact64) / np.linalg.norm(exact64)
    err_diff = np.linalg.norm(diff32 - exact64) / np.linalg.norm(exact64)
    assert err_exact < 1e-5 and err_diff > 100 * err_exact, (err_exact, err_diff)


def test_holding_the_relu_sets_is_what_makes_a_large_step_work(monkeypatch):
    model, cfg, batch = model_and_batch("tied post-LN")
    names = ["encoder.layers.0.ffn.w_1.weight", "encoder.layers.0.ffn.w_1.bias"]
    v = np.random.default_rng(2).standard_normal(sum(dict(model.named_parameters())[n].size for n in names))
    theirs = torch_hvp(model, cfg, batch, names, v)
    with kernel_mode("plain"):
        hessian = BlockHessian(model, batch, names, method="differences")
        big = 3e-2 * hessian.scale / np.linalg.norm(v)  # a step that moves ReLU inputs across zero
        held = np.linalg.norm(hessian(v, big) - theirs) / np.linalg.norm(theirs)
        monkeypatch.setattr(BlockHessian, "_held", lambda self: contextlib.nullcontext())  # planted: the sets not held
        free = np.linalg.norm(hessian(v, big) - theirs) / np.linalg.norm(theirs)
    assert held < 1e-2 and free > 10 * held, (held, free)


def test_the_model_must_be_without_dropout_and_float64_for_differences():
    model, _, batch = model_and_batch("tied post-LN", dropout=0.1)
    with pytest.raises(ValueError, match="dropout 0"):
        BlockHessian(model, batch, ["src_embed.weight"])
    cfg = ModelConfig(vocab_size=13, d_model=8, d_ff=16, heads=2, layers=2, dropout=0.0, max_len=32)
    with pytest.raises(ValueError, match="float64"):
        BlockHessian(Transformer(cfg, seed=1), batch, ["src_embed.weight"], method="differences")
    BlockHessian(Transformer(cfg, seed=1), batch, ["src_embed.weight"])  # exact: float32 is fine
    with pytest.raises(KeyError, match="no parameter"):
        BlockHessian(model_and_batch("tied post-LN")[0], batch, ["nope"])


@pytest.mark.parametrize("block", [["encoder.layers.1.ffn_residual.norm.weight"], ["decoder.layers.0.ffn.w_2.bias"]])
def test_lanczos_extremes_equal_eigh_of_the_dense_hessian(block):
    model, _, batch = model_and_batch("tied post-LN")
    with kernel_mode("plain"):
        hessian = BlockHessian(model, batch, block)
        dense = hessian.dense()
        exact = np.linalg.eigvalsh(dense)
        top, low, _ = extreme_eigenvalues(hessian, hessian.dim, hessian.dim, np.random.default_rng(3), top=2)
    scale = np.abs(exact).max()
    assert abs(top[0] - exact[-1]) <= 1e-7 * scale and abs(top[1] - exact[-2]) <= 1e-7 * scale
    assert abs(low - exact[0]) <= 1e-7 * scale
    assert np.abs(dense - dense.T).max() <= 1e-12 + 1e-7 * scale  # symmetric to the products' error


def test_lanczos_on_a_known_matrix_and_the_quadrature_is_exact_for_the_quadratic_form():
    rng = np.random.default_rng(4)
    eigen = np.concatenate([np.linspace(-1, 1, 40), [5.0, 9.0]])
    q, _ = np.linalg.qr(rng.standard_normal((42, 42)))
    h = (q * eigen) @ q.T
    top, low, _ = extreme_eigenvalues(lambda v: h @ v, 42, 20, rng, top=2)
    assert abs(top[0] - 9.0) < 1e-8 and abs(top[1] - 5.0) < 1e-8 and abs(low + 1.0) < 1e-3
    nodes, weights = slq(lambda v: h @ v, 42, 12, 3, rng)
    assert np.allclose(weights.sum(axis=1), 1.0)
    z = rng.choice([-1.0, 1.0], size=42)
    values, w = ritz(*lanczos(lambda v: h @ v, 42, 12, z))
    assert abs((w * values).sum() - z @ h @ z / 42) < 1e-10  # Gauss quadrature: exact for degree 1
    grid = np.linspace(-3, 11, 2001)
    assert abs(np.trapezoid(density(nodes, weights, grid, 0.1), grid) - 1.0) < 1e-3
