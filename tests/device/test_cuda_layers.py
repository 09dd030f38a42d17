"""On a GPU (``pytest -m gpu``): the CUDA kernels of LayerNorm, the bias gradient and the label-smoothed loss
(numformer/kernels/layernorm.py, linear.py, loss.py) against their plain twins run by cupy, at the kernel sizes
(base: 25,000 tokens x d_model 512, the bias gradient also at d_ff 2,048; the loss at 4,096 tokens x a 37,000-piece
vocabulary), in float32 and float64, and a planted bug in each kernel's source caught. The row and column sums add
in another order than cupy's, so these compare within a tolerance (float64 1e-12, float32 32 ulps, of each value's
scale); the loss's backward sums nothing and is compared bit for bit. Passing here at a source's hash is what
numformer/kernels/cuda_proofs.json records (the kernel then runs by default). The same checks on the CPU, under
the host emulator and at small sizes: tests/kernels/test_cuda_layers_on_host.py."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import kernels
from numformer.kernels import cuda_sources, layernorm as kln, linear as klin, loss as kloss
from numformer.layers.layernorm import layernorm_backward, layernorm_forward
from numformer.layers.linear import linear_backward
from numformer.loss import smoothed_cross_entropy, smoothed_cross_entropy_backward
from worst_error import record_worst

pytestmark = pytest.mark.gpu

TOKENS, D_MODEL, D_FF = 25_000, 512, 2_048
LOSS_TOKENS, VOCAB = 4_096, 37_000
DTYPES = (np.float32, np.float64)
TOL = {np.float64: 1e-12, np.float32: 32 * np.finfo(np.float32).eps}
EPS_LN, EPS_LS = 1e-5, 0.1
RECORD = True  # the worst errors go to the run's table (not a planted bug's)


@pytest.fixture
def xp(monkeypatch):
    """cupy, with the unproven kernels opted in (what proving them means)."""
    cupy = pytest.importorskip("cupy")
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    return cupy


def _normal(xp, shape, dtype, seed, scale=1.0, offset=0.0):
    return (offset + scale * xp.random.RandomState(seed).standard_normal(shape)).astype(dtype)


def assert_close(xp, got, want, dtype, scale=None, what=""):
    """|got - want| <= TOL * scale elementwise (scale: max |want| unless given), on the device."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    got, want = got.astype(xp.float64), want.astype(xp.float64)
    scale = xp.max(xp.abs(want)) if scale is None else xp.asarray(scale, dtype=xp.float64)
    bound = TOL[dtype] * xp.maximum(scale, np.finfo(np.float64).tiny)
    worst = float(xp.max(xp.abs(got - want) / bound))
    if RECORD:  # not a planted bug's
        record_worst(f"cuda-layers-{np.dtype(dtype).name} (x tolerance)", worst, what)
    assert worst <= 1.0, f"{what}: worst error {worst:.3g} x the tolerance"


def check_layernorm(xp, n, d, dtype):
    x = _normal(xp, (n, d), dtype, 0, 2.0, 3.0)  # an offset: the mean's subtraction matters
    gamma, beta = _normal(xp, d, dtype, 1, 0.5, 1.0), _normal(xp, d, dtype, 2)
    dy = _normal(xp, (n, d), dtype, 3)
    y, xhat, r = layernorm_forward(x, gamma, beta, EPS_LN)
    dx, dgamma, dbeta = layernorm_backward(dy, xhat, r, gamma)
    got = kln.layernorm_forward_cuda(x, gamma, beta, EPS_LN)
    got_back = kln.layernorm_backward_cuda(dy, xhat, r, gamma)  # the plain forward's xhat and r
    where = f"layernorm {n}x{d} {np.dtype(dtype).name}"
    assert_close(xp, got[0], y, dtype, what=f"{where} y")
    assert_close(xp, got[1], xhat, dtype, what=f"{where} xhat")
    assert_close(xp, got[2], r, dtype, what=f"{where} r")
    assert_close(xp, got_back[0], dx, dtype, scale=xp.max(xp.abs(dx)) + xp.max(xp.abs(r * dy * gamma)),
                 what=f"{where} dx")
    assert_close(xp, got_back[1], dgamma, dtype, scale=xp.abs(dy * xhat).sum(axis=0), what=f"{where} dgamma")
    assert_close(xp, got_back[2], dbeta, dtype, scale=xp.abs(dy).sum(axis=0), what=f"{where} dbeta")


def check_bias_gradient(xp, n, d, dtype):
    dy = _normal(xp, (n, d), dtype, 4)
    x, w = _normal(xp, (n, 8), dtype, 5), _normal(xp, (8, d), dtype, 6)
    dx, dw, db = linear_backward(dy, x, w, True)
    got = klin.linear_backward_cuda(dy, x, w, True)
    assert_close(xp, got[0], dx, dtype, what="dx")  # the GEMMs: the plain math's own calls
    assert_close(xp, got[1], dw, dtype, what="dW")
    assert_close(xp, got[2], db, dtype, scale=xp.abs(dy).sum(axis=0),
                 what=f"bias gradient {n}x{d} {np.dtype(dtype).name}")


def check_loss(xp, n, v, dtype, overwrite=False):
    z = _normal(xp, (n, v), dtype, 7, 4.0)
    y = xp.random.RandomState(8).randint(0, v, size=n).astype(xp.int64)
    y[0], y[-1] = 0, v - 1  # the first and the last column as targets
    weight = (xp.arange(n) % 3 != 1).astype(dtype) * dtype(1.0 / n)  # every third row padding (weight 0)
    loss, nll, p = smoothed_cross_entropy(z, y, EPS_LS)
    dz = smoothed_cross_entropy_backward(p, y, EPS_LS, weight)
    zc = z.copy()
    got = kloss.smoothed_cross_entropy_cuda(zc, y, EPS_LS, True, overwrite)
    got_dz = kloss.smoothed_cross_entropy_backward_cuda(p.copy(), y, EPS_LS, weight)
    where = f"loss {n}x{v} {np.dtype(dtype).name}"
    lse_scale = xp.max(xp.abs(z), axis=1) + 1.0  # what lse's rounding is relative to
    assert_close(xp, got[0], loss, dtype, scale=lse_scale, what=f"{where} loss")
    assert_close(xp, got[1], nll, dtype, scale=lse_scale, what=f"{where} nll")
    assert (got[2] is zc) == overwrite
    assert_close(xp, got[2], p, dtype, scale=p, what=f"{where} p")  # each probability to its own size
    assert bool((got_dz == dz).all()), f"{where}: the backward is not the plain math's, bit for bit"
    assert not bool(got_dz[1::3].any())  # padding rows get no gradient


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_at_base(dtype, xp):
    check_layernorm(xp, TOKENS, D_MODEL, dtype)


def test_layernorm_at_big_and_odd_widths(xp):
    check_layernorm(xp, 4_000, 1_024, np.float32)  # big's d_model
    check_layernorm(xp, 777, 300, np.float64)
    check_layernorm(xp, 3, kln.LN_MAX_D, np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [D_MODEL, D_FF])
def test_bias_gradient_at_base(d, dtype, xp):
    check_bias_gradient(xp, TOKENS, d, dtype)


def test_bias_gradient_at_odd_shapes(xp):
    check_bias_gradient(xp, 1, 1, np.float32)
    check_bias_gradient(xp, 1_000_003, 3, np.float64)
    check_bias_gradient(xp, 65, VOCAB, np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_at_base(dtype, xp):
    check_loss(xp, LOSS_TOKENS, VOCAB, dtype)


def test_loss_over_its_logits_and_at_odd_shapes(xp):
    check_loss(xp, 512, VOCAB, np.float32, overwrite=True)
    check_loss(xp, 5, 1, np.float64)
    check_loss(xp, 70_000, 7, np.float32)


def test_the_switch_runs_the_kernels_on_device_arrays(xp, monkeypatch):
    """kernel(plain) on cupy arrays: the CUDA kernels when opted in, the plain math when unproven and not."""
    asked = []
    real = cuda_sources.kernel_function
    monkeypatch.setattr(cuda_sources, "kernel_function", lambda name, f: asked.append(f) or real(name, f))
    x, gamma, beta = (_normal(xp, shape, xp.float32, seed) for seed, shape in enumerate([(64, 512), 512, 512]))
    z, y = _normal(xp, (16, 1000), xp.float32, 3), xp.arange(16, dtype=xp.int64)
    weight = xp.full(16, 1 / 16, dtype=xp.float32)

    def run():
        with kernels.kernel_mode("fast"):
            _, xhat, r = kernels.kernel(layernorm_forward)(x, gamma, beta, EPS_LN)
            kernels.kernel(layernorm_backward)(x, xhat, r, gamma)
            kernels.kernel(linear_backward)(x, x, xp.ones((512, 512), xp.float32), True)
            _, _, p = kernels.kernel(smoothed_cross_entropy)(z, y, EPS_LS)
            kernels.kernel(smoothed_cross_entropy_backward)(p, y, EPS_LS, weight)

    run()
    assert asked == ["layernorm_forward_float32", "layernorm_backward_float32", "column_sums_float32",
                     "column_partials_float32", "column_sums_float32", "smoothed_cross_entropy_float32",
                     "smoothed_cross_entropy_backward_float32"]
    asked.clear()
    monkeypatch.delenv("NUMFORMER_CUDA_UNPROVEN")
    monkeypatch.setattr(cuda_sources, "proven", lambda name: False)
    run()
    assert asked == []


PLANTED = {
    "layernorm": [("rr * ((dh - m1) - h * m2)", "rr * (dh - h * m2)"),  # backward: mean(dxhat) dropped
                  ("const T var = q / dd;", "const T var = q / (dd - 1);")],  # forward: the unbiased variance
    "linear": [("for (long long i = r0; i < r1; ++i)", "for (long long i = r0; i < r1 - 1; ++i)")],
    "loss": [("if (t < w) sh_a[t] = sh_a[t] + sh_a[t + w];", "if (t < w && w > 1) sh_a[t] = sh_a[t] + sh_a[t + w];"),
             # forward: the last level of sum(exp(z - max))'s tree lost
             ("pr[c] = g * w;", "pr[c] = g;")],  # backward: padding rows get gradient
}
CHECKS = {"layernorm": lambda xp: check_layernorm(xp, 1_000, D_MODEL, np.float32),
          "linear": lambda xp: check_bias_gradient(xp, TOKENS, D_MODEL, np.float32),
          "loss": lambda xp: check_loss(xp, 64, VOCAB, np.float32)}


@pytest.mark.parametrize("name, bug", [(name, i) for name, bugs in PLANTED.items() for i in range(len(bugs))])
def test_a_planted_bug_is_caught(name, bug, xp, monkeypatch):
    old, new = PLANTED[name][bug]
    assert cuda_sources.SOURCES[name].count(old) == 1, "the planted bug no longer matches the source"
    monkeypatch.setitem(cuda_sources.SOURCES, name, cuda_sources.SOURCES[name].replace(old, new))
    monkeypatch.setattr(cuda_sources, "_MODULES", {})
    monkeypatch.setitem(globals(), "RECORD", False)
    with pytest.raises(AssertionError):
        CHECKS[name](xp)
