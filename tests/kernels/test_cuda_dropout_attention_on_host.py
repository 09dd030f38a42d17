"""The CUDA kernels of dropout and of the attention softmax (numformer/kernels/dropout.py, attention.py) run on the
CPU under the host emulator (numformer/kernels/cuda_emulator.py): each Python wrapper, unchanged, on numpy arrays,
against its plain twin.

* Dropout (``dropout_forward_cuda``): y and the mask equal the plain math's bit for bit (float32 and float64, with
  and without the residual, NaN, infinities and signed zeros among the inputs, sizes around the eight elements of
  a counter), the generator's state moved alike; two draws differ; the same (seed, offset) repeats.
* Attention (``attention_forward_cuda``, ``attention_backward_cuda``): P, O, dQ, dK, dV against the plain math to
  1e-12 of the scale in float64 and 8 ulps in float32 (the row sums add in a tree, not in cupy's order), without a
  mask, with padding (B, 1, 1, Tk), causal and padding (B, 1, Tq, Tk) and a source that is all padding (its rows
  uniform and finite, equal to the plain math's), rows longer than a block's 128 threads, fewer blocks than rows;
  with attention dropout the layer's mask is the plain math's.
* The switch: the registered twins take cupy arrays (here the cupy stand-in, tests/cupy_standin.py) to the CUDA
  wrappers only when the kernel may run; host arrays keep the host kernel (attention) or the plain math (dropout).
* One planted bug per kernel (in its source) is caught.

The same at the kernel sizes on a GPU: tests/device/test_cuda_dropout_attention.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from numformer import counter_rng, kernels
from numformer.backend import RandomState
from numformer.kernels import attention as katt, cuda_sources, dropout as kdrop
from numformer.kernels.cuda_emulator import emulated, host_kernel
from numformer.layers.attention import attention_backward, attention_forward
from numformer.layers.dropout import Dropout, dropout_forward
from numformer.model import causal_mask, padding_mask

DTYPES = (np.float64, np.float32)
TOL = {np.float64: 1e-12, np.float32: 8 * np.finfo(np.float32).eps}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(f"u{a.itemsize}"),
                                                                          b.view(f"u{b.itemsize}"))


def emulate_on_the_standin(monkeypatch, cs):
    """The emulator for arrays of the cupy stand-in: their numpy views go to the emulated kernel (a stand-in array
    lends only cupy's names, and cupy's arrays have no ``ctypes``)."""
    def hook(name, function):
        emulated_function = host_kernel(name, function)

        def call(grid, block, args):
            return emulated_function(grid, block, tuple(a.view(np.ndarray) if isinstance(a, cs.DeviceArray) else a
                                                        for a in args))
        return call
    monkeypatch.setattr(cuda_sources, "KERNEL_FUNCTION_HOOK", hook)


# -- dropout --------------------------------------------------------------------------------------------------
def _x(shape, dtype, seed, specials=False):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    if specials and x.size >= 6:
        flat = x.reshape(-1)
        flat[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310 if dtype == np.float64 else 1e-40]
    return x


def check_dropout(shape, dtype, p, with_add, sources=None, seed=(1 << 40) + 3, offset=(1 << 32) - 2):
    x = _x(shape, dtype, 0, specials=True)
    add = _x(shape, dtype, 1, specials=True) if with_add else None
    plain_rng = RandomState(seed, generator="philox")
    plain_rng.set_state({"seed": seed, "offset": offset})
    state = counter_rng.new_state(np, seed, offset)
    with np.errstate(invalid="ignore", over="ignore"):
        want_y, want_m = dropout_forward(x, plain_rng, p, add)
        with emulated(sources):
            got_y, got_m = kdrop.dropout_forward_cuda(x, state, p, add)
    return (same_bits(got_y, want_y) and same_bits(got_m, want_m)
            and counter_rng.read_state(state) == (seed, plain_rng.get_state()["offset"]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (9,), (3, 5, 7), (37, 64)])
@pytest.mark.parametrize("with_add", [False, True], ids=["y=x*m", "y=x*m+add"])
def test_the_dropout_kernel_is_the_plain_math_bit_for_bit(shape, dtype, with_add):
    assert check_dropout(shape, dtype, 0.1, with_add)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.9])
def test_the_dropout_kernel_at_other_rates(p):
    assert check_dropout((33, 17), np.float32, p, True)


def test_two_draws_differ_and_a_state_repeats():
    x = _x((50, 40), np.float32, 2)
    state = counter_rng.new_state(np, 5, 0)
    with emulated():
        y1, m1 = kdrop.dropout_forward_cuda(x, state, 0.1)
        y2, m2 = kdrop.dropout_forward_cuda(x, state, 0.1)
        assert not np.array_equal(m1, m2)
        state[...] = counter_rng.new_state(np, 5, 0)
        buffers = (np.full_like(x, np.nan), np.full_like(x, np.nan))
        y3, m3 = kdrop.dropout_forward_cuda(x, state, 0.1, out=buffers)  # into given buffers (a captured graph's)
    assert y3 is buffers[0] and m3 is buffers[1]
    assert same_bits(m3, m1) and same_bits(y3, y1)


def test_the_dropout_twin_takes_device_arrays_only_when_the_kernel_may_run(monkeypatch):
    pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
    import cupy_standin as cs

    plain_rng = RandomState(4, generator="philox")
    x, add = _x((6, 10), np.float32, 3), _x((6, 10), np.float32, 4)
    want = dropout_forward(x, plain_rng, 0.2, add)
    assert kernels.fast_twin(dropout_forward) is kdrop.dropout_forward_fast
    assert not kdrop._runs_here(x, RandomState(4), 0.2, add)  # host arrays: the plain math
    xp = cs.install(monkeypatch)
    rng = RandomState(4).to(xp)
    dx, dadd = xp.asarray(x), xp.asarray(add)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "0")
    monkeypatch.setattr(cuda_sources, "PROOFS", cuda_sources.PROOFS.with_name("no-such-proofs.json"))
    assert not kdrop._runs_here(dx, rng, 0.2, dadd)  # unproven: the plain math
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    assert kdrop._runs_here(dx, rng, 0.2, dadd)
    assert not kdrop._runs_here(dx, rng, 0.2, dadd[:, :5])  # an add of another shape: the plain math
    emulate_on_the_standin(monkeypatch, cs)
    with kernels.kernel_mode("fast"):
        got = kernels.kernel(dropout_forward)(dx, rng, 0.2, dadd)
    assert all(type(g) is cs.DeviceArray for g in got)
    assert same_bits(got[0].get(), want[0]) and same_bits(got[1].get(), want[1])
    assert rng.get_state() == plain_rng.get_state()


DROPOUT_BUGS = {
    "the high half of each word read first": ("(w[h >> 1] >> (16 * (h & 1)))", "(w[h >> 1] >> (16 * (1 - (h & 1))))"),
    "the offset moved one counter short": ("state[1] += counters;", "state[1] += counters - 1;"),
}


@pytest.mark.parametrize("bug", list(DROPOUT_BUGS))
def test_a_planted_dropout_bug_is_caught(bug):
    old, new = DROPOUT_BUGS[bug]
    source = cuda_sources.SOURCES["dropout"]
    assert old in source
    planted = {"dropout": source.replace(old, new)}
    x = _x((40, 24), np.float32, 5)
    rng, state = RandomState(8, generator="philox"), counter_rng.new_state(np, 8, 0)
    with emulated(planted):
        caught = False
        for _ in range(2):  # a second draw: an offset moved wrong shows there
            want = dropout_forward(x, rng, 0.1)
            got = kdrop.dropout_forward_cuda(x, state, 0.1)
            caught |= not (same_bits(got[0], want[0]) and same_bits(got[1], want[1]))
    assert caught, bug


# -- attention ------------------------------------------------------------------------------------------------
def _attention_inputs(b, h, tq, tk, d, dtype, mask_kind, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = ((rng.standard_normal((b, h, t, d)) * 1.5).astype(dtype) for t in (tq, tk, tk))
    dout = rng.standard_normal((b, h, tq, d)).astype(dtype)
    lengths = np.maximum(tk - 3 * np.arange(b), 1)
    lengths[-1] = 0 if b > 1 else lengths[-1]  # a source that is all padding: its rows fully masked
    ids = np.where(np.arange(tk)[None, :] < lengths[:, None], 5, 0)
    if mask_kind is None:
        masked = None
    elif mask_kind == "padding":
        masked = ~padding_mask(ids, 0)                                   # (B, 1, 1, Tk)
    else:
        masked = ~(causal_mask(tk)[..., -tq:, :] & padding_mask(ids, 0))  # (B, 1, Tq, Tk)
        masked = np.ascontiguousarray(np.broadcast_to(masked, (b, 1, tq, tk)))
    return q, k, v, dout, masked


def assert_close(got, want, dtype, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape and np.isfinite(got).all(), what
    scale = max(float(np.max(np.abs(want))), np.finfo(np.float64).tiny)
    worst = float(np.max(np.abs(got - want))) / scale
    assert worst <= TOL[dtype], f"{what}: {worst:.3g} of the scale (tolerance {TOL[dtype]:.3g})"


def run_attention(q, k, v, dout, masked, scale, sources=None):
    with emulated(sources):
        out, p, p_used = katt.attention_forward_cuda(q, k, v, masked, scale)
        grads = katt.attention_backward_cuda(dout, q, k, v, p, p_used, masked, scale)
    return out, p, grads


ATTENTION_SHAPES = [(3, 2, 5, 7, 4), (2, 2, 9, 9, 8), (2, 1, 3, 150, 4), (1, 3, 1, 40, 4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("mask_kind", [None, "padding", "causal+padding"])
@pytest.mark.parametrize("shape", ATTENTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_attention_kernels_equal_the_plain_math(shape, mask_kind, dtype):
    q, k, v, dout, masked = _attention_inputs(*shape, dtype, mask_kind)
    scale = 1.0 / float(np.sqrt(shape[-1]))  # a Python float, as the layer passes it
    want_out, want_p, _ = attention_forward(q, k, v, masked, scale)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, scale)
    out, p, grads = run_attention(q, k, v, dout, masked, scale)
    assert p.dtype == dtype and out.dtype == dtype
    assert_close(p, want_p, dtype, "P")
    assert_close(out, want_out, dtype, "O")
    for name, g, w in zip(("dQ", "dK", "dV"), grads, want):
        assert g.dtype == dtype
        assert_close(g, w, dtype, name)
    if mask_kind is not None and shape[0] > 1:
        assert same_bits(p[-1], want_p[-1])  # the all-padding source: uniform rows, exactly the plain math's
        assert np.all(p[-1] == dtype(1.0) / dtype(shape[3]))


def test_fewer_blocks_than_rows(monkeypatch):
    """The row loop wraps: a grid of 3 blocks for 2 * 2 * 9 rows."""
    monkeypatch.setattr(katt, "MAX_ROW_BLOCKS", 3)
    q, k, v, dout, masked = _attention_inputs(2, 2, 9, 9, 8, np.float64, "causal+padding")
    want_out, want_p, _ = attention_forward(q, k, v, masked, 0.3)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, 0.3)
    out, p, grads = run_attention(q, k, v, dout, masked, 0.3)
    assert_close(p, want_p, np.float64, "P")
    for g, w in zip(grads, want):
        assert_close(g, w, np.float64, "grad")


def test_attention_dropout_is_the_layers(monkeypatch):
    """With attention dropout the twin calls the layer on P (its mask drawn from the same stream as the plain
    math's) and its backward on dP: P_used and the gradients agree, the layer keeps its mask for backward."""
    q, k, v, dout, masked = _attention_inputs(2, 2, 6, 6, 4, np.float64, "padding")
    layers = [Dropout(0.25, RandomState(3, generator="philox")).train() for _ in range(2)]
    want_out, want_p, want_used = attention_forward(q, k, v, masked, 0.5, layers[0])
    want = attention_backward(dout, q, k, v, want_p, want_used, masked, 0.5, layers[0].backward)
    with emulated():
        out, p, p_used = katt.attention_forward_cuda(q, k, v, masked, 0.5, layers[1])
        grads = katt.attention_backward_cuda(dout, q, k, v, p, p_used, masked, 0.5, layers[1].backward)
    assert np.array_equal(p_used == 0, want_used == 0) and (want_used == 0).any()
    assert_close(p_used, want_used, np.float64, "P_used")
    assert_close(out, want_out, np.float64, "O")
    for g, w in zip(grads, want):
        assert_close(g, w, np.float64, "grad")


def test_the_attention_twins_dispatch_by_array_type(monkeypatch):
    pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
    import cupy_standin as cs

    q, k, v, dout, masked = _attention_inputs(2, 2, 5, 5, 4, np.float32, "causal+padding")
    want_out, want_p, _ = attention_forward(q, k, v, masked, 0.5)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, 0.5)
    assert katt._forward_runs_here(q, k, v, masked, 0.5) and not katt._forward_runs_here(q, k, v, masked, 0.5, len)
    xp = cs.install(monkeypatch)
    dq, dk, dv, ddout, dmasked = (xp.asarray(a) for a in (q, k, v, dout, masked))
    monkeypatch.setattr(cuda_sources, "PROOFS", cuda_sources.PROOFS.with_name("no-such-proofs.json"))
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "0")
    assert not katt._forward_runs_here(dq, dk, dv, dmasked, 0.5)
    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    assert katt._forward_runs_here(dq, dk, dv, dmasked, 0.5)
    assert katt._forward_runs_here(dq, dk, dv, dmasked, 0.5, len)  # dropout too: the layer runs between
    assert not katt._forward_runs_here(dq, dk, dv, xp.asarray(masked[:, :, :2]), 0.5)  # a mask that does not fit
    emulate_on_the_standin(monkeypatch, cs)
    with kernels.kernel_mode("fast"):
        out, p, p_used = kernels.kernel(attention_forward)(dq, dk, dv, dmasked, 0.5)
        grads = kernels.kernel(attention_backward)(ddout, dq, dk, dv, p, p_used, dmasked, 0.5)
    assert type(out) is cs.DeviceArray and type(grads[0]) is cs.DeviceArray
    assert_close(p.get(), want_p, np.float32, "P")
    assert_close(out.get(), want_out, np.float32, "O")
    for g, w in zip(grads, want):
        assert_close(g.get(), w, np.float32, "grad")


ATTENTION_BUGS = {
    "forward: the row sum's tree starts at a quarter of the block": (
        "T total = nf_block_sum(part, red);\n        for (long long j = threadIdx.x; j < tk; j += blockDim.x) row[j]",
        "T total = nf_block_sum(part, red) - part;\n        for (long long j = threadIdx.x; j < tk; j += blockDim.x) "
        "row[j]"),
    "forward: the mask not applied": ("if (MASKED && mrow[j * sk]) v = fill;", "if (MASKED && mrow[j * sk]) v = v;"),
    "backward: masked scores keep their gradient": ("if (MASKED && mrow[j * sk]) v = 0;", ""),
    "backward: the row's sum of dP * P left out": ("T v = prow[j] * (drow[j] - total);", "T v = prow[j] * drow[j];"),
}


@pytest.mark.parametrize("bug", list(ATTENTION_BUGS))
def test_a_planted_attention_bug_is_caught(bug):
    old, new = ATTENTION_BUGS[bug]
    source = cuda_sources.SOURCES["attention"]
    assert source.count(old) == 1
    q, k, v, dout, masked = _attention_inputs(3, 2, 5, 7, 4, np.float64, "causal+padding")
    want_out, want_p, _ = attention_forward(q, k, v, masked, 0.5)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, 0.5)
    out, p, grads = run_attention(q, k, v, dout, masked, 0.5, {"attention": source.replace(old, new)})
    with np.errstate(invalid="ignore"):
        errors = [np.max(np.abs(np.asarray(a, np.float64) - b)) for a, b in zip((p, out, *grads), (want_p, want_out,
                                                                                                  *want))]
    assert not all(e <= 1e-12 for e in errors), f"{bug}: not caught ({errors})"
