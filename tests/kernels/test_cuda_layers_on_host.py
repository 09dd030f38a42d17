"""The CUDA kernels of LayerNorm, the bias gradient and the label-smoothed loss (numformer/kernels/layernorm.py,
linear.py, loss.py) run on the CPU under the host emulator (numformer/kernels/cuda_emulator.py): each Python
wrapper, unchanged, on numpy arrays, against its plain twin, at small odd shapes, at a real row size (d_model 512
and 1024; a vocabulary of 8,000) and with the grids' row loops and column partials forced to wrap (fewer blocks
than rows). float64 to 1e-12 of the scale, float32 to 32 ulps of it (the row sums add in another order than
numpy's); the loss's backward, which sums nothing, bit for bit. A planted bug in each kernel's source is caught.
The same comparisons at the kernel sizes on a GPU: tests/device/test_cuda_layers.py."""
from __future__ import annotations

import numpy as np
import pytest

from numformer import kernels
from numformer.kernels import cuda_sources, layernorm as kln, linear as klin, loss as kloss
from numformer.kernels.cuda_emulator import emulated
from numformer.layers.layernorm import layernorm_backward, layernorm_forward
from numformer.layers.linear import linear_backward
from numformer.loss import smoothed_cross_entropy, smoothed_cross_entropy_backward
from worst_error import record_worst

DTYPES = (np.float64, np.float32)
TOL = {np.float64: 1e-12, np.float32: 32 * np.finfo(np.float32).eps}
EPS_LN, EPS_LS = 1e-5, 0.1
RECORD = True  # the worst errors go to the run's table (not a planted bug's)


def assert_close(got, want, dtype, scale=None, what=""):
    """|got - want| <= TOL * scale, elementwise; scale: max |want| unless given (an array broadcasting to want's
    shape: the sum of the magnitudes a column sum adds)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = np.max(np.abs(want)) if scale is None else np.asarray(scale, np.float64)
    err = np.abs(got - want)
    bound = TOL[dtype] * np.maximum(scale, np.finfo(np.float64).tiny)
    worst = float(np.max(err / bound)) if err.size else 0.0
    if RECORD:  # not a planted bug's
        record_worst(f"cuda-layers-emulated-{np.dtype(dtype).name} (x tolerance)", worst, what)
    assert worst <= 1.0, f"{what}: worst error {worst:.3g} x the tolerance ({np.max(err):.3g})"


def _ln_inputs(n, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = (3.0 + 2.0 * rng.standard_normal((n, d))).astype(dtype)  # an offset: the mean's subtraction matters
    gamma = (1.0 + 0.5 * rng.standard_normal(d)).astype(dtype)
    beta = rng.standard_normal(d).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)
    return x, gamma, beta, dy


def check_layernorm(n, d, dtype, sources=None):
    x, gamma, beta, dy = _ln_inputs(n, d, dtype)
    y, xhat, r = layernorm_forward(x, gamma, beta, EPS_LN)
    dx, dgamma, dbeta = layernorm_backward(dy, xhat, r, gamma)
    with emulated(sources):
        got = kln.layernorm_forward_cuda(x, gamma, beta, EPS_LN)
        got_back = kln.layernorm_backward_cuda(dy, xhat, r, gamma)  # the plain forward's xhat and r
    for a in (*got, *got_back):
        assert a.dtype == dtype
    assert_close(got[0], y, dtype, what="y")
    assert_close(got[1], xhat, dtype, what="xhat")
    assert_close(got[2], r, dtype, what="r")
    assert_close(got_back[0], dx, dtype, scale=np.max(np.abs(dx)) + np.max(np.abs(r * dy * gamma)), what="dx")
    assert_close(got_back[1], dgamma, dtype, scale=np.abs(dy * xhat).sum(axis=0), what="dgamma")
    assert_close(got_back[2], dbeta, dtype, scale=np.abs(dy).sum(axis=0), what="dbeta")


def check_bias_gradient(n, d, dtype, sources=None):
    rng = np.random.default_rng(1)
    dy, x, w = (rng.standard_normal(s).astype(dtype) for s in ((n, d), (n, 5), (5, d)))
    dx, dw, db = linear_backward(dy, x, w, True)
    with emulated(sources):
        got = klin.linear_backward_cuda(dy, x, w, True)
        assert klin.linear_backward_cuda(dy, x, w, False)[2] is None
    assert np.array_equal(got[0], dx) and np.array_equal(got[1], dw)  # the GEMMs: the plain math's own
    assert got[2].dtype == dtype
    assert_close(got[2], db, dtype, scale=np.abs(dy).sum(axis=0), what="db")


def _loss_inputs(n, v, dtype, seed=2):
    rng = np.random.default_rng(seed)
    z = (4.0 * rng.standard_normal((n, v))).astype(dtype)
    y = rng.integers(0, v, n)
    y[0], y[-1] = 0, v - 1  # the first and the last column as targets
    weight = np.where(np.arange(n) % 3 == 1, 0.0, 1.0 / n).astype(dtype)  # every third row padding (weight 0)
    return z, y, weight


def check_loss(n, v, dtype, sources=None, keep_probs=True, overwrite=False):
    z, y, weight = _loss_inputs(n, v, dtype)
    loss, nll, p = smoothed_cross_entropy(z, y, EPS_LS)
    dz = smoothed_cross_entropy_backward(p, y, EPS_LS, weight)
    zc = z.copy()
    with emulated(sources):
        got = kloss.smoothed_cross_entropy_cuda(zc, y, EPS_LS, keep_probs, overwrite)
        got_dz = kloss.smoothed_cross_entropy_backward_cuda(p.copy(), y, EPS_LS, weight)
    lse_scale = np.max(np.abs(z), axis=1) + 1.0  # what lse's rounding is relative to
    assert_close(got[0], loss, dtype, scale=lse_scale, what="loss")
    assert_close(got[1], nll, dtype, scale=lse_scale, what="nll")
    if keep_probs:
        assert (got[2] is zc) if overwrite else not np.shares_memory(got[2], zc)
        assert_close(got[2], p, dtype, scale=p, what="p")  # each probability to its own size
    else:
        assert got[2] is None and np.array_equal(zc, z)
    assert np.array_equal(got_dz, dz), "the loss's backward: each element as the plain math rounds it"
    assert not got_dz[1::3].any()  # padding rows get no gradient


# -- the kernels against the plain math ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d", [(1, 1), (3, 7), (2, 300), (4, 512)])
def test_layernorm_kernels_are_the_plain_math(n, d, dtype):
    check_layernorm(n, d, dtype)


def test_layernorm_at_its_widest_row():
    """d 1,024 (big's d_model, 4 columns a thread) and 2,048 (the widest backward takes: 8 a thread)."""
    check_layernorm(2, 1024, np.float32)
    check_layernorm(1, kln.LN_MAX_D, np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_with_more_rows_than_blocks(dtype, monkeypatch):
    """The grid-stride loops over the rows, and backward's partials of several rows a block, summed over 3."""
    monkeypatch.setattr(kln, "LN_FORWARD_BLOCKS", 2)
    monkeypatch.setattr(kln, "LN_BACKWARD_BLOCKS", 3)
    check_layernorm(8, 40, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d", [(1, 1), (5, 3), (300, 512), (700, 2)])
def test_bias_gradient_is_the_plain_column_sum(n, d, dtype):
    check_bias_gradient(n, d, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gradient_over_many_chunks_and_tiles(dtype, monkeypatch):
    """Chunks of 3 rows (the last one short), two column tiles, a grid smaller than the tasks, more partials a
    column than lanes (33 > 8), and the second stage over two blocks of 32 columns with a wrapping grid."""
    monkeypatch.setattr(klin, "MIN_ROWS_PER_CHUNK", 3)
    monkeypatch.setattr(klin, "CP_MAX_BLOCKS", 5)
    monkeypatch.setattr(klin, "CS_MAX_BLOCKS", 2)
    check_bias_gradient(98, 300, dtype)


def test_bias_gradient_chunks_stay_bounded():
    """Many rows: chunks grow so that a column has at most MAX_CHUNKS partials."""
    check_bias_gradient(klin.MAX_CHUNKS * klin.MIN_ROWS_PER_CHUNK + 5, 3, np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, v", [(1, 1), (3, 5), (4, 300), (6, 8000)])
def test_loss_kernels_are_the_plain_math(n, v, dtype):
    check_loss(n, v, dtype)


@pytest.mark.parametrize("keep_probs, overwrite", [(False, False), (True, True)])
def test_loss_without_probabilities_and_over_the_logits(keep_probs, overwrite):
    check_loss(5, 700, np.float32, keep_probs=keep_probs, overwrite=overwrite)


def test_loss_with_more_rows_than_blocks(monkeypatch):
    monkeypatch.setattr(kloss, "LOSS_BLOCKS", 2)
    check_loss(7, 40, np.float64)
    check_loss(7, 40, np.float32, overwrite=True)


def test_loss_takes_int32_targets():
    z, y, weight = _loss_inputs(4, 50, np.float32)
    want = smoothed_cross_entropy(z, y, EPS_LS)
    with emulated():
        got = kloss.smoothed_cross_entropy_cuda(z, y.astype(np.int32), EPS_LS)
    assert_close(got[1], want[1], np.float32, scale=np.max(np.abs(z)) + 1)


# -- planted bugs: the comparisons above catch each ----------------------------------------------------------------
def _ln(sources):
    check_layernorm(3, 40, np.float64, sources)


def _ln_wide(sources):
    check_layernorm(2, 512, np.float32, sources)


def _bias(sources):
    check_bias_gradient(200, 30, np.float64, sources)


def _loss(sources):
    check_loss(4, 300, np.float64, sources)


PLANTED = {  # what goes wrong: (kernel, the source's text, the bug in its place, the check that must fail)
    "layernorm forward: the unbiased variance": (
        "layernorm", "const T var = q / dd;", "const T var = q / (dd - 1);", _ln),
    "layernorm forward: the tree's last level lost": (
        "layernorm", "for (int s = LN_THREADS / 2; s > 0; s >>= 1)", "for (int s = LN_THREADS / 2; s > 1; s >>= 1)",
        _ln_wide),
    "layernorm backward: mean(dxhat) dropped": ("layernorm", "rr * ((dh - m1) - h * m2)", "rr * (dh - h * m2)", _ln),
    "column sums: the last partial lost": ("layernorm", "i < p; i += CS_LANES", "i < p - 1; i += CS_LANES", _ln),
    "bias gradient: the last row of each chunk lost": (
        "linear", "for (long long i = r0; i < r1; ++i)", "for (long long i = r0; i < r1 - 1; ++i)", _bias),
    "loss forward: eps over V - 1 classes (fairseq's)": (
        "loss", "eps * (lse - zsum / (T)v)", "eps * (lse - zsum / (T)(v - 1))", _loss),
    "loss backward: the weight not applied (padding gets gradient)": ("loss", "pr[c] = g * w;", "pr[c] = g;", _loss),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_is_caught(bug, monkeypatch):
    name, old, new, check = PLANTED[bug]
    source = cuda_sources.SOURCES[name]
    assert source.count(old) == 1, "the planted bug no longer matches the source"
    check(None)  # the right source passes
    monkeypatch.setitem(globals(), "RECORD", False)
    with pytest.raises(AssertionError):
        check({name: source.replace(old, new)})


# -- the switch: host arrays keep the host kernels; "device" arrays reach the CUDA wrappers ---------------------
def test_host_arrays_keep_the_host_kernels(monkeypatch):
    def no_cuda(*args):
        raise AssertionError("a CUDA kernel was asked for host arrays")
    monkeypatch.setattr(cuda_sources, "kernel_function", no_cuda)
    monkeypatch.setattr(cuda_sources, "KERNEL_FUNCTION_HOOK", None)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    x, gamma, beta, dy = _ln_inputs(3, 16, np.float32)
    z, y, weight = _loss_inputs(3, 16, np.float32)
    with kernels.kernel_mode("fast"):
        yy, xhat, r = kernels.kernel(layernorm_forward)(x, gamma, beta, EPS_LN)
        kernels.kernel(layernorm_backward)(dy, xhat, r, gamma)
        kernels.kernel(linear_backward)(dy, x, gamma[:, None] * np.ones((1, 16), np.float32), True)
        _, _, p = kernels.kernel(smoothed_cross_entropy)(z, y, EPS_LS)
        kernels.kernel(smoothed_cross_entropy_backward)(p, y, EPS_LS, weight)
    assert kln._forward_runs_here(x, gamma, beta, EPS_LN) and klin._backward_runs_here(dy, x, x, True)
    assert kloss._forward_runs_here(z, y, EPS_LS) and kloss._backward_runs_here(p, y, EPS_LS, weight)


def _pretend_device(monkeypatch):
    """numpy arrays taken for device arrays by the three kernel files (is_cupy_array: always), the kernels run
    by the emulator: the switch's whole path to the CUDA wrappers, on the CPU."""
    for module in (kln, klin, kloss):
        monkeypatch.setattr(module, "is_cupy_array", lambda a: True)


@pytest.mark.parametrize("opted_in", [True, False])
def test_device_arrays_reach_the_cuda_kernels_only_when_they_may_run(opted_in, monkeypatch, tmp_path):
    """Unproven (no record in the proofs file) and not opted in: the plain math runs (no kernel asked for);
    opted in: each CUDA wrapper runs and gives the plain math's results."""
    monkeypatch.setattr(cuda_sources, "PROOFS", tmp_path / "none.json")
    if opted_in:
        monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    else:
        monkeypatch.delenv("NUMFORMER_CUDA_UNPROVEN", raising=False)
    _pretend_device(monkeypatch)
    asked = []
    real = cuda_sources.kernel_function
    monkeypatch.setattr(cuda_sources, "kernel_function", lambda name, f: asked.append(f) or real(name, f))
    x, gamma, beta, dy = _ln_inputs(3, 20, np.float64)
    z, y, weight = _loss_inputs(3, 30, np.float64)
    w = np.ones((20, 20))
    want = (*layernorm_forward(x, gamma, beta, EPS_LN), *linear_backward(dy, x, w, True),
            *smoothed_cross_entropy(z, y, EPS_LS))
    want_back = layernorm_backward(dy, want[1], want[2], gamma)
    want_dz = smoothed_cross_entropy_backward(want[8], y, EPS_LS, weight)
    with emulated(), kernels.kernel_mode("fast"):
        got = (*kernels.kernel(layernorm_forward)(x, gamma, beta, EPS_LN),
               *kernels.kernel(linear_backward)(dy, x, w, True), *kernels.kernel(smoothed_cross_entropy)(z, y, EPS_LS))
        got_back = kernels.kernel(layernorm_backward)(dy, want[1], want[2], gamma)
        got_dz = kernels.kernel(smoothed_cross_entropy_backward)(want[8].copy(), y, EPS_LS, weight)
    for a, b in zip((*got, *got_back, got_dz), (*want, *want_back, want_dz)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    expected = ["layernorm_forward_float64", "column_partials_float64", "column_sums_float64",
                "smoothed_cross_entropy_float64", "layernorm_backward_float64", "column_sums_float64",
                "smoothed_cross_entropy_backward_float64"]
    assert asked == (expected if opted_in else [])


def test_what_the_kernels_do_not_take_runs_the_plain_math():
    """Strided, integer, mismatched or (backward) too wide arguments are refused by the fits checks."""
    x, gamma, beta, dy = _ln_inputs(4, 16, np.float32)
    assert kln.layernorm_forward_fits(x, gamma, beta)
    assert not kln.layernorm_forward_fits(x[:, ::2], gamma[::2], beta[::2])
    assert not kln.layernorm_forward_fits(x, gamma.astype(np.float64), beta)
    assert not kln.layernorm_forward_fits(x.astype(np.int32), gamma, beta)
    r = np.ones((4, 1), np.float32)
    assert kln.layernorm_backward_fits(dy, x, r, gamma)
    assert not kln.layernorm_backward_fits(dy, x, r.T.copy(), gamma)
    wide = np.zeros((1, kln.LN_MAX_D + 1), np.float32)
    assert not kln.layernorm_backward_fits(wide, wide, np.ones((1, 1), np.float32), wide[0])
    assert klin.bias_gradient_fits(dy) and not klin.bias_gradient_fits(dy.T)
    assert not klin.bias_gradient_fits(np.zeros((0, 3), np.float32))
    z, y, weight = _loss_inputs(4, 16, np.float32)
    assert kloss.smoothed_cross_entropy_fits(z, y)
    assert not kloss.smoothed_cross_entropy_fits(z, y.astype(np.float32))
    assert not kloss.smoothed_cross_entropy_fits(z, y[:3])
    assert kloss.smoothed_cross_entropy_backward_fits(z, y, weight)
    assert not kloss.smoothed_cross_entropy_backward_fits(z, y, weight.astype(np.float64))
