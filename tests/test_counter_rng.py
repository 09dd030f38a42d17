"""The counter-based generator of the GPU's dropout masks (numformer/counter_rng.py, Philox4x32-10) and the
RandomState that holds its state (numformer/backend.py): Random123's published known answers; the CUDA twin
(numformer/kernels/dropout.py, run on the host emulator) gives the same words and the same advance; the stream's
layout as dropout_mask's docstring states it; states that repeat, move on and checkpoint as host ints; rates that
are right (bounds of five standard deviations: a wrong lane, a reused word or a biased threshold is far outside);
and the GPU branch of dropout_mask on the cupy stand-in (names cupy has) drawing the CPU philox generator's masks.
"""
from __future__ import annotations

import numpy as np
import pytest

from numformer import counter_rng
from numformer.backend import RandomState
from numformer.kernels import cuda_sources, dropout as kdropout
from numformer.kernels.cuda_emulator import emulated
from numformer.layers.dropout import dropout_mask

U = np.uint64

# Random123's known-answer vectors for philox4x32-10 (its tests/kat_vectors; Salmon et al. 2011): counter, key,
# output, 32-bit words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def _words(seed: int, offset: int, blocks: int) -> np.ndarray:
    """(blocks, 4) uint32: the stream's words for counters offset.., from the plain math, written out here."""
    c = (U(offset) + np.arange(blocks, dtype=U)) if offset + blocks < 1 << 64 else \
        np.array([(offset + t) % (1 << 64) for t in range(blocks)], dtype=U)
    m = U(0xFFFFFFFF)
    w = counter_rng.philox4x32_10(c & m, c >> U(32), U(0), U(0), U(seed) & m, U(seed) >> U(32))
    return np.stack(w, axis=-1).astype(np.uint32)


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_gives_random123s_known_answers(counter, key, expected):
    got = counter_rng.philox4x32_10(*(U(c) for c in counter), *(U(k) for k in key))
    assert tuple(int(w) for w in got) == expected


def test_the_cuda_generator_gives_the_known_answers_and_the_plain_words():
    """The CUDA twin's words: Random123's (a state whose seed and counter are the vectors' words, counter words 2
    and 3 being 0 in the stream: the first vector), and the plain math's across the 2^32 carry of the counter, with
    a seed above 2^32, and at the 2^64 wrap."""
    with emulated():
        zero = kdropout.philox_stream_words_cuda(counter_rng.new_state(np, 0, 0), 1)
        assert tuple(int(w) for w in zero[0]) == KNOWN_ANSWERS[0][2]
        for seed, offset in [(0x299F31D0A4093822, (1 << 32) - 5), (7, 0), (1 << 63, (1 << 64) - 3)]:
            state = counter_rng.new_state(np, seed, offset)
            got = kdropout.philox_stream_words_cuda(state, 1000)
            assert np.array_equal(got, _words(seed, offset, 1000)), (seed, offset)
            assert counter_rng.read_state(state) == (seed, offset)  # reading the stream does not move it


def test_the_stream_is_the_halves_of_the_words_low_half_first():
    state = counter_rng.new_state(np, 12345, 77)
    w = _words(12345, 77, 3).astype(np.uint64)
    halves = np.stack([w & U(0xFFFF), w >> U(16)], axis=-1).reshape(-1)  # word 0 low, word 0 high, word 1 low...
    assert np.array_equal(counter_rng.bits16(np, state, 21), halves[:21].astype(np.uint16))
    assert counter_rng.read_state(state) == (12345, 77)
    counter_rng.advance(state, 21)
    assert counter_rng.read_state(state) == (12345, 77 + 3)  # ceil(21 / 8) counters


@pytest.mark.parametrize("n", [0, 1, 8, 9, 1000])
def test_the_cuda_advance_is_the_plain_advance(n):
    plain, device = counter_rng.new_state(np, 3, (1 << 64) - 2), counter_rng.new_state(np, 3, (1 << 64) - 2)
    counter_rng.advance(plain, n)
    with emulated():
        kdropout.advance_cuda("dropout", device, n)
    assert np.array_equal(plain, device)  # including the wrap mod 2^64


def test_a_philox_random_state_repeats_moves_on_and_checkpoints_as_host_ints():
    rng = RandomState(11, generator="philox")
    assert rng.kind == "philox" and rng.generator is None and rng.counter.dtype == np.uint64
    start = rng.get_state()
    assert start == {"seed": 11, "offset": 0} and all(type(v) is int for v in start.values())
    counter = rng.counter
    a = dropout_mask(rng, (37, 41), 0.1, np.float32)
    b = dropout_mask(rng, (37, 41), 0.1, np.float32)
    assert not np.array_equal(a, b)  # the second draw reads new counters
    assert rng.get_state() == {"seed": 11, "offset": 2 * -(-37 * 41 // 8)}
    rng.set_state(start)
    assert rng.counter is counter  # written in place: a captured graph keeps reading the same memory
    assert np.array_equal(dropout_mask(rng, (37, 41), 0.1, np.float32), a)
    rng.set_state({"seed": 11})  # a seed alone (the batch-keyed reseeding) starts at offset 0
    assert np.array_equal(dropout_mask(rng, (37, 41), 0.1, np.float32), a)
    other = RandomState(12, generator="philox")
    assert not np.array_equal(dropout_mask(other, (37, 41), 0.1, np.float32), a)


def test_the_default_cpu_generator_is_unchanged():
    """pcg64 stays the CPU's: its state and its bits are what they were (dropout_mask's documented layout)."""
    rng = RandomState(5)
    assert rng.kind == "pcg64" and rng.counter is None and set(rng.get_state()) == {"seed", "bit_generator"}
    bits = np.random.default_rng(5).bit_generator.random_raw(-(-(6 * 7) // 4)).view(np.uint16)[:42]
    mask = dropout_mask(rng, (6, 7), 0.25, np.float64)
    assert np.array_equal(mask.ravel() == 0, bits < round(0.25 * 65536))
    with pytest.raises(Exception, match="philox"):
        rng.stream16(4)


def test_keep_rate_scale_and_independence():
    """p = 0.1 over 2^20 elements: the dropped fraction is p' = round(p 2^16) / 2^16 and the mask's mean is 1 (the
    expectation is exact), each within five standard deviations; every one of the eight halves of a counter has
    that rate (a wrong lane, e.g. the high half read twice, shows here only through the pairs); neighbours are
    uncorrelated; the 16-bit numbers' top four bits are uniform (chi-square, 15 degrees of freedom, < 50: the
    0.99999 quantile is about 45)."""
    n, p = 1 << 20, 0.1
    t = round(p * 65536)
    p_ = t / 65536
    rng = RandomState(2024, generator="philox")
    mask = dropout_mask(rng, (n,), p, np.float64)
    dropped = mask == 0
    sd = np.sqrt(p_ * (1 - p_) / n)
    assert abs(dropped.mean() - p_) < 5 * sd
    assert np.all(np.isin(mask, [0.0, 65536 / (65536 - t)]))
    assert abs(mask.mean() - 1.0) < 5 * mask.std() / np.sqrt(n)
    lanes = dropped.reshape(-1, 8).mean(axis=0)
    assert np.all(np.abs(lanes - p_) < 5 * np.sqrt(p_ * (1 - p_) / (n / 8))), lanes
    d = dropped.astype(np.float64) - dropped.mean()
    corr = float((d[:-1] * d[1:]).mean() / d.var())
    assert abs(corr) < 5 / np.sqrt(n)
    bits = RandomState(7, generator="philox").stream16(n)
    counts = np.bincount(bits >> 12, minlength=16)
    expected = n / 16
    assert ((counts - expected) ** 2 / expected).sum() < 50


def test_uniform_from_the_stream():
    rng = RandomState(3, generator="philox")
    for dtype in (np.float32, np.float64):
        u = rng.uniform((1000, 100), dtype)
        assert u.dtype == dtype and u.shape == (1000, 100)
        assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / u.size)
    state = rng.get_state()
    a = rng.uniform((3, 4), np.float32)
    rng.set_state(state)
    assert np.array_equal(a, rng.uniform((3, 4), np.float32))


def test_moving_a_philox_stream_keeps_its_place(monkeypatch):
    """to(): a philox stream carries its offset to the other device; the GPU branch of dropout_mask (on the cupy
    stand-in: only names cupy has, no host array as an operand) draws the CPU philox generator's masks."""
    pytest.importorskip("cupy", reason="cupy (importable without a GPU) is installed by .ci/setup")
    import cupy_standin as cs

    xp = cs.install(monkeypatch)
    host = RandomState(9, generator="philox")
    dropout_mask(host, (5, 3), 0.3, np.float32)  # move the host stream first
    device = RandomState(9, generator="philox")
    dropout_mask(device, (5, 3), 0.3, np.float32)
    device.to(xp)
    assert device.kind == "philox" and type(device.counter) is cs.DeviceArray
    for shape, dtype in [((64, 33), np.float32), ((3, 5, 7), np.float64)]:
        want = dropout_mask(host, shape, 0.3, dtype)
        got = dropout_mask(device, shape, 0.3, dtype)
        assert type(got) is cs.DeviceArray and got.dtype == dtype and got.shape == shape
        assert np.array_equal(got.get(), want)
    assert device.get_state() == host.get_state()
    assert RandomState(9).to(xp).kind == "philox"  # the GPU's generator is philox, whatever the CPU's was


def test_the_dropout_source_is_registered_and_compiles():
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC is installed by .ci/setup")
    ptx = cuda_sources.compile_ptx("dropout")
    for entry in ("counter_advance", "philox_stream_words", "dropout_forward_float32", "dropout_forward_add_float64"):
        assert f".entry {entry}" in ptx
