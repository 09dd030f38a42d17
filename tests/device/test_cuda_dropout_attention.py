"""On a GPU (``pytest -m gpu``): the dropout and attention-softmax CUDA kernels (numformer/kernels/dropout.py,
attention.py) and the counter generator they share, against their plain twins run by cupy, at the kernel sizes:
dropout on base's 25,000 tokens x d_model 512 (float32 and float64, with and without the residual) bit for bit,
the CUDA Philox words equal to the plain math's on the device and on the host; attention with 8 heads, Tq = Tk =
64, batch 64, no mask, padding, causal and padding, a source all padding (rows uniform and finite, bit for bit),
float64 to 1e-12 and float32 to 8 ulps of the scale. A step's dropout captured as a CUDA graph and replayed draws
new masks each replay, each the plain math's at the offset it read. A planted bug in each kernel's source is
caught. Passing here at a source's hash is what numformer/kernels/cuda_proofs.json records. The same checks under
the host emulator at small sizes: tests/kernels/test_cuda_dropout_attention_on_host.py and tests/test_counter_rng.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from numformer import counter_rng, kernels
from numformer.backend import RandomState, to_host
from numformer.kernels import attention as katt, cuda_sources, dropout as kdrop
from numformer.layers.attention import attention_backward, attention_forward
from numformer.layers.dropout import Dropout, dropout_forward
from numformer.model import causal_mask, padding_mask

pytestmark = pytest.mark.gpu

TOKENS, D_MODEL = 25_000, 512
BATCH, HEADS, T, D_K = 64, 8, 64, 64
DTYPES = (np.float32, np.float64)
TOL = {np.float64: 1e-12, np.float32: 8 * np.finfo(np.float32).eps}
SEED, OFFSET = (1 << 40) + 3, (1 << 32) - 7  # a seed above 2^32, an offset whose counters carry into the high word


@pytest.fixture
def xp(monkeypatch):
    """cupy (numformer's backend set to it), with the unproven kernels opted in (what proving them means)."""
    pytest.importorskip("cupy")
    from numformer.backend import import_cupy

    monkeypatch.setenv("NUMFORMER_CUDA_UNPROVEN", "1")
    return import_cupy()


def same_bits(xp, a, b) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    unsigned = f"u{a.dtype.itemsize}"
    return bool((a.view(unsigned) == b.view(unsigned)).all())


def _normal(xp, shape, dtype, seed, scale=1.0):
    """Normal numbers drawn on the host (numpy), moved to the device."""
    return xp.asarray((scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype))


def _x(xp, shape, dtype, seed, specials=True):
    x = (np.random.default_rng(seed).standard_normal(shape)).astype(dtype)
    if specials:
        x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    return xp.asarray(x)


def _philox_rng(xp, seed=SEED, offset=OFFSET):
    rng = RandomState(seed).to(xp)
    rng.set_state({"seed": seed, "offset": offset})
    return rng


# -- the generator --------------------------------------------------------------------------------------------
def test_the_cuda_words_are_the_plain_maths_on_the_device_and_the_host(xp):
    blocks = 1 << 20
    state = counter_rng.new_state(xp, SEED, OFFSET)
    words = kdrop.philox_stream_words_cuda(state, blocks)
    plain = counter_rng.bits16(xp, state, 8 * blocks)  # the same counters' halves, from the plain math on cupy
    w = words.astype(xp.uint64)
    halves = xp.stack([w & np.uint64(0xFFFF), w >> np.uint64(16)], axis=-1).reshape(-1).astype(xp.uint16)
    assert bool((halves == plain).all())
    host = counter_rng.bits16(np, counter_rng.new_state(np, SEED, OFFSET), 8 * 4096)  # numpy's uint64 math
    assert np.array_equal(to_host(plain[: 8 * 4096]), host)
    zero = kdrop.philox_stream_words_cuda(counter_rng.new_state(xp, 0, 0), 1)
    assert [int(v) for v in to_host(zero)[0]] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]  # Random123's


# -- dropout --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("with_add", [False, True], ids=["y=x*m", "y=x*m+add"])
def test_the_dropout_kernel_is_the_plain_math_bit_for_bit(xp, dtype, with_add):
    x = _x(xp, (TOKENS, D_MODEL), dtype, 0)
    add = _x(xp, (TOKENS, D_MODEL), dtype, 1) if with_add else None
    rng = _philox_rng(xp)
    state = counter_rng.new_state(xp, SEED, OFFSET)
    want_y, want_m = dropout_forward(x, rng, 0.1, add)  # the plain math on cupy: the counter stream as arrays
    got_y, got_m = kdrop.dropout_forward_cuda(x, state, 0.1, add)
    assert same_bits(xp, got_y, want_y) and same_bits(xp, got_m, want_m)
    assert counter_rng.read_state(state) == (SEED, rng.get_state()["offset"])
    dropped = float((got_m == 0).mean())
    p_ = round(0.1 * 65536) / 65536
    assert abs(dropped - p_) < 5 * math.sqrt(p_ * (1 - p_) / x.size)


def test_the_dropout_twin_runs_the_kernel_and_draws_anew(xp):
    x, add = _x(xp, (TOKENS, D_MODEL), np.float32, 2, False), _x(xp, (TOKENS, D_MODEL), np.float32, 3, False)
    rng, plain_rng = _philox_rng(xp), _philox_rng(xp)
    with kernels.kernel_mode("fast"):
        fused = kernels.kernel(dropout_forward)
        assert kdrop._runs_here(x, rng, 0.1, add)
        first, second = fused(x, rng, 0.1, add), fused(x, rng, 0.1, add)
    assert not bool((first[1] == second[1]).all())
    for got in (first, second):
        want = dropout_forward(x, plain_rng, 0.1, add)
        assert same_bits(xp, got[0], want[0]) and same_bits(xp, got[1], want[1])


def test_a_captured_dropout_draws_new_masks_at_each_replay(xp):
    """The kernel and the offset's advance captured once as a CUDA graph (given buffers: nothing allocated inside)
    and replayed: each replay's mask is the plain math's at the offset the device state then held."""
    cupy = xp
    x, add = _x(xp, (TOKENS, D_MODEL), np.float32, 4, False), _x(xp, (TOKENS, D_MODEL), np.float32, 5, False)
    state = counter_rng.new_state(xp, SEED, 0)
    buffers = (xp.empty_like(x), xp.empty_like(x))
    kdrop.dropout_forward_cuda(x, state, 0.1, add, out=buffers)  # warm-up: the module loaded before the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        kdrop.dropout_forward_cuda(x, state, 0.1, add, out=buffers)
        graph = stream.end_capture()
    step = counter_rng.counters(x.size)
    masks = []
    for replay in range(2):
        offset = counter_rng.read_state(state)[1]
        graph.launch(stream)
        stream.synchronize()
        assert counter_rng.read_state(state)[1] == offset + step
        want = dropout_forward(x, _philox_rng(xp, SEED, offset), 0.1, add)
        assert same_bits(xp, buffers[0], want[0]) and same_bits(xp, buffers[1], want[1]), replay
        masks.append(buffers[1].copy())
    assert not bool((masks[0] == masks[1]).all())


def test_a_planted_dropout_bug_is_caught(xp, monkeypatch):
    """The high half of each word read first: the masks differ from the plain math's."""
    monkeypatch.setitem(cuda_sources.SOURCES, "dropout", cuda_sources.SOURCES["dropout"].replace(
        "(w[h >> 1] >> (16 * (h & 1)))", "(w[h >> 1] >> (16 * (1 - (h & 1))))"))
    monkeypatch.setattr(cuda_sources, "_MODULES", {})
    x = _x(xp, (4096, 64), np.float32, 6, False)
    want = dropout_forward(x, _philox_rng(xp), 0.1)
    got = kdrop.dropout_forward_cuda(x, counter_rng.new_state(xp, SEED, OFFSET), 0.1)
    assert not same_bits(xp, got[1], want[1])


# -- attention ------------------------------------------------------------------------------------------------
def _attention_inputs(xp, dtype, mask_kind, seed=0):
    q, k, v, dout = (_normal(xp, (BATCH, HEADS, T, D_K), dtype, 10 * seed + i, 1.5) for i in range(4))
    lengths = np.maximum(T - np.arange(BATCH), 1)
    lengths[-1] = 0  # a source all padding: its rows fully masked
    ids = np.where(np.arange(T)[None, :] < lengths[:, None], 5, 0)
    if mask_kind is None:
        return q, k, v, dout, None
    mask = padding_mask(ids, 0) if mask_kind == "padding" else causal_mask(T) & padding_mask(ids, 0)
    return q, k, v, dout, ~xp.asarray(mask)


def assert_close(xp, got, want, dtype, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert bool(xp.isfinite(got).all()), what
    got, want = got.astype(xp.float64), want.astype(xp.float64)
    worst = float(xp.max(xp.abs(got - want)) / max(float(xp.max(xp.abs(want))), np.finfo(np.float64).tiny))
    assert worst <= TOL[dtype], f"{what}: {worst:.3g} of the scale (tolerance {TOL[dtype]:.3g})"


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("mask_kind", [None, "padding", "causal+padding"])
def test_the_attention_kernels_equal_the_plain_math(xp, dtype, mask_kind):
    q, k, v, dout, masked = _attention_inputs(xp, dtype, mask_kind)
    scale = 1.0 / math.sqrt(D_K)
    want_out, want_p, _ = attention_forward(q, k, v, masked, scale)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, scale)
    with kernels.kernel_mode("fast"):
        assert katt._forward_runs_here(q, k, v, masked, scale)
        out, p, p_used = kernels.kernel(attention_forward)(q, k, v, masked, scale)
        grads = kernels.kernel(attention_backward)(dout, q, k, v, p, p_used, masked, scale)
    assert_close(xp, p, want_p, dtype, "P")
    assert_close(xp, out, want_out, dtype, "O")
    for name, g, w in zip(("dQ", "dK", "dV"), grads, want):
        assert_close(xp, g, w, dtype, name)
    if masked is not None:
        assert same_bits(xp, p[-1], want_p[-1])  # the all-padding source: uniform, the plain math's bits
        assert bool((p[-1] == dtype(1.0) / dtype(T)).all())


def test_attention_dropout_is_the_layers(xp):
    q, k, v, dout, masked = _attention_inputs(xp, np.float32, "causal+padding", seed=1)
    layers = [Dropout(0.1, _philox_rng(xp)).train() for _ in range(2)]
    want_out, want_p, want_used = attention_forward(q, k, v, masked, 0.125, layers[0])
    want = attention_backward(dout, q, k, v, want_p, want_used, masked, 0.125, layers[0].backward)
    out, p, p_used = katt.attention_forward_cuda(q, k, v, masked, 0.125, layers[1])
    grads = katt.attention_backward_cuda(dout, q, k, v, p, p_used, masked, 0.125, layers[1].backward)
    assert bool(((p_used == 0) == (want_used == 0)).all())
    assert_close(xp, p_used, want_used, np.float32, "P_used")
    assert_close(xp, out, want_out, np.float32, "O")
    for g, w in zip(grads, want):
        assert_close(xp, g, w, np.float32, "grad")


@pytest.mark.parametrize("old, new", [
    ("if (MASKED && mrow[j * sk]) v = fill;", "if (MASKED && mrow[j * sk]) v = v;"),
    ("T v = prow[j] * (drow[j] - total);", "T v = prow[j] * drow[j];"),
], ids=["forward: the mask not applied", "backward: the row's sum of dP * P left out"])
def test_a_planted_attention_bug_is_caught(xp, monkeypatch, old, new):
    assert cuda_sources.SOURCES["attention"].count(old) == 1
    monkeypatch.setitem(cuda_sources.SOURCES, "attention", cuda_sources.SOURCES["attention"].replace(old, new))
    monkeypatch.setattr(cuda_sources, "_MODULES", {})
    q, k, v, dout, masked = _attention_inputs(xp, np.float64, "causal+padding")
    want_out, want_p, _ = attention_forward(q, k, v, masked, 0.125)
    want = attention_backward(dout, q, k, v, want_p, want_p, masked, 0.125)
    out, p, p_used = katt.attention_forward_cuda(q, k, v, masked, 0.125)
    grads = katt.attention_backward_cuda(dout, q, k, v, p, p_used, masked, 0.125)
    errors = [float(xp.max(xp.abs(a - b))) for a, b in zip((p, out, *grads), (want_p, want_out, *want))]
    assert not all(e <= 1e-12 for e in errors), errors
