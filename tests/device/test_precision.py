"""Opt-in matmul precision (numformer.precision): fp32 default, fp16 with float32 master weights, TF32, loss scaling.

On the CPU the fp16 GEMM is emulated with the arithmetic of cuBLAS's (float16 operands,
float32 accumulation, float16 result; see numformer/precision.py), so these tests check
what the GPU computes. Errors are norm-wise, ``norm(a - b) / norm(b)`` per tensor.

Measured on the CPU (the tolerances below leave room over these):

* one Linear or OutputProjection, forward and backward: at most 4.2e-4 against float32
  (float16 keeps 11 significant bits: unit roundoff 2**-11 = 4.9e-4); MultiHeadAttention
  (self and encoder-decoder): at most 1.2e-3 (worst over 5 seeds);
* the tiny Transformer (d_model 16, post- and pre-LN), loss: 4e-5; worst parameter
  gradient: 1.7e-3
  (the key biases excepted: their gradient is zero in exact arithmetic, a softmax does
  not see a shift shared by all keys, so float32 and fp16 both return rounding noise);
* 48 Adam steps on one batch with the loss scaler: final loss within 0.2% of float32's.

GPU tests (marker ``gpu``) run the same comparisons on cupy, where fp16 is cuBLAS's and
TF32 is switched on through cupy's compute type.
"""
import json
import math
import os
import sys

import numpy as np
import pytest

from numformer.backend import to_host
from numformer.layers.attention import MultiHeadAttention
from numformer.layers.linear import Linear
from numformer.layers.projection import OutputProjection
from numformer.loss import LabelSmoothedCrossEntropy
from numformer.model import Transformer
from numformer.optim import Adam, NoamSchedule, clip_grad_norm, grad_norm
from numformer.backend import matmul
from numformer.precision import (PrecisionError, get_matmul_precision, matmul_precision, set_matmul_precision)
from numformer.training.loss_scaling import DynamicLossScaler
from numformer.presets import get_preset
from support import no_exact_gradient

LAYER_TOL = 2e-3   # one layer, fp16 vs float32 (measured <= 1.2e-3)
MODEL_TOL = 5e-3   # every gradient of the tiny Transformer (measured <= 1.7e-3)

SRC = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
TGT = np.array([[2, 11, 12, 13, 3], [2, 14, 3, 0, 0]])


@pytest.fixture(autouse=True)
def fp32_after_each_test():
    """Every test starts and ends in the default mode, whatever it set (the mode is process-wide)."""
    assert get_matmul_precision() == "fp32"
    yield
    set_matmul_precision("fp32")


def rel(a, b):
    a, b = to_host(a).astype(np.float64), to_host(b).astype(np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def tiny_cfg(**kw):
    return get_preset("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, dropout=0.0, **kw)


def linear_pass(mode, dtype=np.float32, seed=0, dy_scale=1.0):
    """Forward and backward of one Linear (d_in 24, d_out 40) on (3, 5, 24): (y, dx, dW, db, layer)."""
    rng = np.random.default_rng(seed)
    lin = Linear(24, 40, rng=np.random.default_rng(1), dtype=dtype)
    x = rng.standard_normal((3, 5, 24)).astype(dtype)
    dy = (rng.standard_normal((3, 5, 40)) * dy_scale).astype(dtype)
    with matmul_precision(mode):
        y = lin(x)
        dx = lin.backward(dy)
    return y, dx, lin.weight.grad, lin.bias.grad, lin


def model_pass(mode, dtype=np.float32, scaler=None, **kw):
    """Loss and gradients of the tiny Transformer on one batch with padding."""
    m = Transformer(tiny_cfg(**kw), seed=0, dtype=dtype)
    crit = LabelSmoothedCrossEntropy(0.1)
    with matmul_precision(mode):
        loss = crit.forward(m(SRC, TGT[:, :-1]), TGT[:, 1:])
        d = crit.backward()
        m.backward(scaler.scale_grad_(d) if scaler is not None else d)
    if scaler is not None:
        scaler.unscale_(m.parameters())
    return float(loss), {n: p.grad.copy() for n, p in m.named_parameters()}, m


def significant(grads):
    """Names of the gradients that are not zero in exact arithmetic (the key biases' are, see the module doc)."""
    total = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
    return [n for n, g in grads.items() if np.linalg.norm(g) > 1e-6 * total]


# -- the default ---------------------------------------------------------------------
def test_default_mode_is_fp32_and_bit_identical_to_at():
    assert get_matmul_precision() == "fp32"
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    assert np.array_equal(matmul(a, b), a @ b)

    y, dx, gw, gb, lin = linear_pass("fp32")
    rng = np.random.default_rng(0)  # the draws of linear_pass
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    dy = rng.standard_normal((3, 5, 40)).astype(np.float32)
    w = lin.weight.data
    assert np.array_equal(y, (x.reshape(-1, 24) @ w).reshape(3, 5, 40))  # bias is zero
    assert np.array_equal(dx, (dy.reshape(-1, 40) @ w.T).reshape(3, 5, 24))
    assert np.array_equal(gw, x.reshape(-1, 24).T @ dy.reshape(-1, 40))

    # a round trip through another mode leaves the default exactly as it was
    set_matmul_precision("fp16")
    set_matmul_precision("fp32")
    again = linear_pass("fp32")
    for p, q in zip((y, dx, gw, gb), again[:4]):
        assert np.array_equal(p, q)


def test_mode_switching_and_errors():
    assert set_matmul_precision("float16") == "fp32"
    assert get_matmul_precision() == "fp16"
    with matmul_precision("fp32"):
        assert get_matmul_precision() == "fp32"
    assert get_matmul_precision() == "fp16"
    set_matmul_precision("fp32")
    with pytest.raises(RuntimeError):
        with matmul_precision("fp16"):
            raise RuntimeError("inside")
    assert get_matmul_precision() == "fp32"  # restored on the way out of an exception
    with pytest.raises(ValueError, match="use one of fp32, tf32, fp16"):
        set_matmul_precision("int8")
    with pytest.raises(ValueError, match="bfloat16"):
        set_matmul_precision("bf16")
    assert get_matmul_precision() == "fp32"


def test_tf32_is_refused_on_the_cpu():
    with pytest.raises(PrecisionError, match="--device cuda"):
        set_matmul_precision("tf32", device="cpu")
    assert get_matmul_precision() == "fp32"
    assert isinstance(PrecisionError("x"), ValueError)
    before = os.environ.get("CUPY_TF32")
    set_matmul_precision("tf32")  # no device given: refused at the first float32 GEMM on the host
    assert os.environ.get("CUPY_TF32") == "1"
    a = np.ones((2, 2), dtype=np.float32)
    with pytest.raises(PrecisionError, match="--device cuda"):
        matmul(a, a)
    with pytest.raises(ValueError, match="--device cuda"):
        Linear(2, 3)(a)
    # float64 (gradient checks) is never affected
    assert np.array_equal(matmul(a.astype(np.float64), a.astype(np.float64)), a.astype(np.float64) @ a)
    set_matmul_precision("fp32")
    assert os.environ.get("CUPY_TF32") == before  # the environment is as it was


def test_tf32_with_cupy_already_imported(monkeypatch):
    """cupy caches its float32 compute type: numformer resets it so CUPY_TF32 is read again (a stand-in cupy)."""
    import types

    calls = []
    linalg = types.SimpleNamespace(COMPUTE_TYPE_TBD=0, set_compute_type=lambda dt, ct: calls.append((dt, ct)))
    core = types.ModuleType("cupy._core")
    core._routines_linalg = linalg
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    monkeypatch.setitem(sys.modules, "cupy._core", core)
    monkeypatch.delenv("CUPY_TF32", raising=False)
    set_matmul_precision("tf32", device="cuda")
    assert os.environ["CUPY_TF32"] == "1" and calls == [(np.float32, 0)]
    set_matmul_precision("fp16")
    assert "CUPY_TF32" not in os.environ and len(calls) == 2  # reset again: cupy re-reads the unset variable
    set_matmul_precision("fp32")
    assert len(calls) == 2  # fp16 -> fp32 never touches cupy

    # a cupy without that internal: a one-line error, and nothing changed
    del core._routines_linalg
    monkeypatch.setitem(sys.modules, "cupy._core._routines_linalg", None)  # "import" fails
    with pytest.raises(PrecisionError, match="before the model is moved to the GPU"):
        set_matmul_precision("tf32", device="cuda")
    assert get_matmul_precision() == "fp32" and "CUPY_TF32" not in os.environ


# -- fp16 ------------------------------------------------------------------------------
def test_fp16_gemm_rounds_operands_and_result_to_float16():
    eps = np.float32(2.0 ** -12)  # below float16's resolution at 1 (2**-10), within float32's
    a = np.array([[1 + eps, 1.0]], dtype=np.float32)
    b = np.array([[1.0], [eps * 8]], dtype=np.float32)  # 2**-9: exact in float16
    with matmul_precision("fp16"):
        c = matmul(a, b)
    assert c.dtype == np.float32
    assert c[0, 0] == np.float32(1 + 2.0 ** -9)           # a's 2**-12 rounded away, b's 2**-9 kept
    assert (a @ b)[0, 0] == np.float32(1 + 2.0 ** -12 + 2.0 ** -9)
    big = np.array([[300.0]], dtype=np.float32)
    with matmul_precision("fp16"):
        assert np.isinf(matmul(big, big)[0, 0])           # 90000 > 65504: overflow, as on the GPU
        assert matmul(np.array([[1e-8]], dtype=np.float32), np.ones((1, 1), np.float32))[0, 0] == 0  # underflow


def test_fp16_linear_matches_fp32():
    ref = linear_pass("fp32")
    out = linear_pass("fp16")
    for name, p, q in zip(("y", "dx", "dW", "db"), ref[:4], out[:4]):
        assert q.dtype == np.float32, name
        assert rel(q, p) < LAYER_TOL, name
    assert rel(out[0], ref[0]) > 0  # it really ran in lower precision
    lin = out[4]
    assert lin.weight.data.dtype == np.float32 and lin.bias.data.dtype == np.float32
    fresh = Linear(24, 40, rng=np.random.default_rng(1))
    assert np.array_equal(lin.weight.data, fresh.weight.data)  # the master weights are untouched


def test_fp16_output_projection_matches_fp32():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((2, 3, 16)).astype(np.float32)
    dl = rng.standard_normal((2, 3, 30)).astype(np.float32)
    results = {}
    for mode in ("fp32", "fp16"):
        proj = OutputProjection(16, 30, rng=np.random.default_rng(1))
        w0 = proj.weight.data.copy()
        with matmul_precision(mode):
            logits = proj(h)
            dh = proj.backward(dl)
        assert logits.dtype == dh.dtype == proj.weight.grad.dtype == np.float32
        assert np.array_equal(proj.weight.data, w0)
        results[mode] = (logits, dh, proj.weight.grad)
    for p, q in zip(results["fp32"], results["fp16"]):
        assert rel(q, p) < LAYER_TOL


@pytest.mark.parametrize("cross", [False, True])
def test_fp16_multi_head_attention_matches_fp32(cross):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 16)).astype(np.float32)
    mem = rng.standard_normal((2, 6, 16)).astype(np.float32) if cross else None
    mask = np.ones((2, 1, 1, 6 if cross else 4), dtype=bool)
    mask[1, ..., -2:] = False  # padding in the batch
    dy = rng.standard_normal((2, 4, 16)).astype(np.float32)
    results = {}
    for mode in ("fp32", "fp16"):
        mha = MultiHeadAttention(16, 2, rng=np.random.default_rng(1))
        with matmul_precision(mode):
            y = mha(x, mem, mask) if cross else mha(x, mask=mask)
            d = mha.backward(dy)
        d = d if cross else (d,)
        grads = {n: p.grad for n, p in mha.named_parameters()}
        assert all(g.dtype == np.float32 for g in (y, *d, *grads.values()))
        assert all(p.data.dtype == np.float32 for p in mha.parameters())
        results[mode] = (y, d, grads)
    (y32, d32, g32), (y16, d16, g16) = results["fp32"], results["fp16"]
    assert rel(y16, y32) < LAYER_TOL
    for a, b in zip(d16, d32):
        assert rel(a, b) < LAYER_TOL
    for n in significant(g32):
        assert rel(g16[n], g32[n]) < LAYER_TOL, n


@pytest.mark.parametrize("kw", [dict(), dict(pre_norm=True, tie_embeddings=False)])
def test_fp16_transformer_close_to_fp32(kw):
    l32, g32, _ = model_pass("fp32", **kw)
    l16, g16, m16 = model_pass("fp16", **kw)
    assert abs(l16 - l32) / l32 < 1e-3
    assert all(g.dtype == np.float32 for g in g16.values())
    assert all(p.data.dtype == np.float32 for p in m16.parameters())
    names = significant(g32)
    assert all(no_exact_gradient(n) for n in set(g32) - set(names))  # only the key biases are left out
    for n in names:
        assert rel(g16[n], g32[n]) < MODEL_TOL, n


@pytest.mark.parametrize("mode", ["fp16", "tf32"])
def test_float64_models_are_unaffected(mode):
    """Gradient checks run in float64: no mode may touch them (bit-identical)."""
    l_ref, g_ref, _ = model_pass("fp32", dtype=np.float64)
    l, g, _ = model_pass(mode, dtype=np.float64)
    assert l == l_ref
    for n in g_ref:
        assert np.array_equal(g[n], g_ref[n]), n
    ref = linear_pass("fp32", dtype=np.float64)
    out = linear_pass(mode, dtype=np.float64)
    for p, q in zip(ref[:4], out[:4]):
        assert q.dtype == np.float64 and np.array_equal(p, q)


# -- dynamic loss scaling ----------------------------------------------------------------
def test_scaler_overflow_halves_and_skips_growth_after_interval():
    s = DynamicLossScaler(growth_interval=3)
    assert s.scale == 2.0 ** 15
    assert s.update(found_nonfinite=True) is True       # skip this step
    assert s.scale == 2.0 ** 14 and s.skipped_steps == 1
    assert s.update(False) is False and s.update(False) is False
    assert s.scale == 2.0 ** 14                          # two good steps: not yet
    assert s.update(False) is False
    assert s.scale == 2.0 ** 15 and s.good_steps == 0    # the third one doubles it
    s.update(False)
    s.update(True)                                       # an overflow restarts the count
    assert s.scale == 2.0 ** 14 and s.good_steps == 0
    d = DynamicLossScaler()
    assert (d.growth_factor, d.backoff_factor, d.growth_interval) == (2.0, 0.5, 2000)


def test_scaler_floor_and_exhaustion():
    s = DynamicLossScaler(init_scale=4.0, min_scale=1.0)
    s.update(True)
    s.update(True)
    assert s.scale == 1.0 and not s.exhausted
    assert s.update(True) is True and s.scale == 1.0
    assert s.exhausted                                   # overflow with no scaling left: a real failure
    s.update(False)
    assert not s.exhausted


def test_scaler_state_dict_round_trip():
    s = DynamicLossScaler(growth_interval=5)
    for found in (True, False, False, True, False):
        s.update(found)
    state = json.loads(json.dumps(s.state_dict()))  # checkpoint metadata is JSON-safe
    t = DynamicLossScaler()
    t.load_state_dict(state)
    assert t.state_dict() == s.state_dict()
    for found in (False, False, False, False, True, False):
        assert s.update(found) == t.update(found)
    assert s.state_dict() == t.state_dict()
    with pytest.raises(ValueError):
        t.load_state_dict({"scale": float("inf")})


def test_unscale_gives_the_true_gradient():
    """A backward seeded with scale S, then unscaled, equals the plain backward.

    float32: bit-identical (S is a power of two, and backward is linear in its seed).
    fp16: as close to float32 as an unscaled fp16 backward.
    """
    l_ref, g_ref, _ = model_pass("fp32")
    l, g, _ = model_pass("fp32", scaler=DynamicLossScaler())
    assert l == l_ref
    for n in g_ref:
        assert np.array_equal(g[n], g_ref[n]), n
    _, g16, _ = model_pass("fp16", scaler=DynamicLossScaler())
    for n in significant(g_ref):
        assert rel(g16[n], g_ref[n]) < MODEL_TOL, n


def test_scaling_rescues_gradients_that_underflow_in_fp16():
    """Upstream gradients around 1e-8 round to zero in float16 (smallest subnormal 6e-8); scaled they survive."""
    tiny = 1e-8
    y32, dx32, gw32, _, _ = linear_pass("fp32", dy_scale=tiny)
    _, dx16, gw16, _, _ = linear_pass("fp16", dy_scale=tiny)
    assert np.count_nonzero(dx16) < 0.1 * dx16.size and rel(dx16, dx32) > 0.5   # lost without scaling
    assert np.count_nonzero(gw16) < 0.1 * gw16.size and rel(gw16, gw32) > 0.5

    # the same backward, seeded with the scale and unscaled after (what the trainer does)
    scaler = DynamicLossScaler()
    rng = np.random.default_rng(0)
    lin = Linear(24, 40, rng=np.random.default_rng(1))
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    dy = (rng.standard_normal((3, 5, 40)) * tiny).astype(np.float32)
    with matmul_precision("fp16"):
        lin(x)
        dx = lin.backward(scaler.scale_grad_(dy.copy()))
    dx = dx / scaler.scale  # an input gradient is unscaled by its user, like the parameters' below
    scaler.unscale_(lin.parameters())
    assert rel(dx, dx32) < LAYER_TOL
    assert rel(lin.weight.grad, gw32) < LAYER_TOL


def test_overflow_is_detected_and_the_scale_backs_off():
    """A scale too large overflows float16 in backward: non-finite norm, step skipped, scale halved until fine."""
    scaler = DynamicLossScaler(init_scale=2.0 ** 40)
    skipped = 0
    while True:
        with np.errstate(over="ignore", invalid="ignore"):  # inf, then nan, flows through backward
            _, grads, m = model_pass("fp16", scaler=scaler)
            gnorm = float(grad_norm(list(m.parameters())))
        if not scaler.update(found_nonfinite=not math.isfinite(gnorm)):
            break
        skipped += 1
        assert skipped < 40
    assert skipped >= 1 and scaler.skipped_steps == skipped
    assert scaler.scale == 2.0 ** (40 - skipped)
    _, g32, _ = model_pass("fp32")
    for n in significant(g32):
        assert rel(grads[n], g32[n]) < MODEL_TOL, n


def train(mode, steps=48):
    """A few dozen Adam steps on one batch: the losses (the loss scaler in fp16 mode).

    A gentle schedule: at twice this learning rate both runs spike, and where one spikes
    the other need not (the trajectories part for reasons that are not precision).
    """
    model = Transformer(tiny_cfg(), seed=0)
    params = list(model.parameters())
    opt = Adam(params, schedule=NoamSchedule(16, warmup=10, factor=0.5))
    crit = LabelSmoothedCrossEntropy(0.1)
    scaler = DynamicLossScaler(growth_interval=10) if mode == "fp16" else None
    losses = []
    with matmul_precision(mode):
        for _ in range(steps):
            loss = crit.forward(model(SRC, TGT[:, :-1]), TGT[:, 1:])
            d = crit.backward()
            model.backward(scaler.scale_grad_(d) if scaler else d)
            if scaler:
                scaler.unscale_(params)
            gnorm = clip_grad_norm(params, 1.0)
            losses.append(float(loss))
            skip = scaler.update(not math.isfinite(float(gnorm))) if scaler else False
            assert math.isfinite(losses[-1])
            if not skip:
                opt.step()
            opt.zero_grad()
    return losses, scaler


def test_short_fp16_training_with_loss_scaling_tracks_fp32():
    l32, _ = train("fp32")
    l16, scaler = train("fp16")
    assert l32[-1] < 0.5 * l32[0]                      # it learns
    assert abs(l16[-1] - l32[-1]) / l32[-1] < 0.02      # measured 0.2%
    assert scaler.scale > 2.0 ** 15                    # grew every 10 good steps


# -- GPU ---------------------------------------------------------------------------------
def _gpu_model_pass(mode, **kw):
    import cupy

    m = Transformer(tiny_cfg(**kw), seed=0).to("cuda")
    crit = LabelSmoothedCrossEntropy(0.1)
    with matmul_precision(mode, device="cuda"):
        loss = crit.forward(m(cupy.asarray(SRC), cupy.asarray(TGT[:, :-1])), cupy.asarray(TGT[:, 1:]))
        m.backward(crit.backward())
    return float(loss), {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.gpu
def test_gpu_fp16_gemm_matches_host_emulation():
    import cupy

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 80)).astype(np.float32)
    with matmul_precision("fp16"):
        host = matmul(a, b)
        dev = matmul(cupy.asarray(a), cupy.asarray(b))
        dev_t = matmul(cupy.asarray(b).T, cupy.asarray(a).T)  # transposed views: no copy, same numbers
    assert isinstance(dev, cupy.ndarray) and dev.dtype == np.float32
    assert rel(dev, host) < 1e-3 and rel(dev_t, host.T) < 1e-3
    assert rel(dev, a @ b) < LAYER_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(), dict(pre_norm=True, tie_embeddings=False)])
def test_gpu_fp16_transformer_close_to_fp32(kw):
    l32, g32 = _gpu_model_pass("fp32", **kw)
    l16, g16 = _gpu_model_pass("fp16", **kw)
    assert abs(l16 - l32) / l32 < 1e-3
    host32 = {n: to_host(g) for n, g in g32.items()}
    for n in significant(host32):
        assert g16[n].dtype == np.float32
        assert rel(g16[n], g32[n]) < MODEL_TOL, n


@pytest.mark.gpu
def test_gpu_tf32_is_switched_on_and_off():
    import cupy

    rng = np.random.default_rng(0)
    a64, b64 = rng.standard_normal((1024, 1024)), rng.standard_normal((1024, 1024))
    exact = a64 @ b64
    a, b = cupy.asarray(a64, dtype=cupy.float32), cupy.asarray(b64, dtype=cupy.float32)
    err_fp32 = rel(a @ b, exact)
    assert err_fp32 < 2e-5
    with matmul_precision("tf32", device="cuda"):
        err_tf32 = rel(matmul(a, b), exact)
        err_tf32_at = rel(a @ b, exact)  # cupy's process-wide setting: plain @ too, not only matmul()
    assert err_tf32 < 3e-3 and err_tf32_at < 3e-3
    if int(cupy.cuda.Device().compute_capability) >= 80:  # TF32 exists from Ampere on
        assert err_tf32 > 5e-5 and err_tf32_at > 5e-5
    assert rel(a @ b, exact) < 2e-5  # back to full float32 after the block


@pytest.mark.gpu
def test_gpu_tf32_transformer_close_to_fp32():
    l32, g32 = _gpu_model_pass("fp32")
    ltf, gtf = _gpu_model_pass("tf32")
    assert abs(ltf - l32) / l32 < 1e-3
    host32 = {n: to_host(g) for n, g in g32.items()}
    for n in significant(host32):
        assert rel(gtf[n], g32[n]) < MODEL_TOL, n


@pytest.mark.gpu
def test_gpu_loss_scaler_on_device_arrays():
    import cupy

    scaler = DynamicLossScaler()
    m = Transformer(tiny_cfg(), seed=0).to("cuda")
    crit = LabelSmoothedCrossEntropy(0.1)
    with matmul_precision("fp16", device="cuda"):
        crit.forward(m(cupy.asarray(SRC), cupy.asarray(TGT[:, :-1])), cupy.asarray(TGT[:, 1:]))
        m.backward(scaler.scale_grad_(crit.backward()))
    scaler.unscale_(m.parameters())
    assert all(isinstance(p.grad, cupy.ndarray) and p.grad.dtype == np.float32 for p in m.parameters())
    assert scaler.update(not math.isfinite(float(grad_norm(list(m.parameters()))))) is False
    _, g32 = _gpu_model_pass("fp32")
    names = significant({k: to_host(v) for k, v in g32.items()})
    for n, p in m.named_parameters():
        if n in names:
            assert rel(p.grad, g32[n]) < MODEL_TOL, n
