"""Philox4x32-10, a counter-based random generator, as plain array math (numpy and cupy alike).

Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), Section 4.2: the
output for a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)`` (32-bit words) is ten rounds of

    (hi0, lo0) = mulhilo(M0, c0);  (hi1, lo1) = mulhilo(M1, c2)
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)

with ``mulhilo(a, b)`` the high and low 32-bit words of the 64-bit product, ``M0 = 0xD2511F53``,
``M1 = 0xCD9E8D57``, and the key bumped by the Weyl constants ``W0 = 0x9E3779B9``, ``W1 = 0xBB67AE85``
(mod 2^32) before each round after the first. A pure function of (key, counter): nothing is carried from one
number to the next, so a GPU computes any element of a stream alone, and a step replayed as a CUDA graph draws
new numbers as long as the counter it reads from device memory has moved.

**The stream** (what dropout masks read on the GPU, numformer.layers.dropout.dropout_mask): a *state* is a
(2,) uint64 array ``[seed, offset]`` on the device that uses it. Its 16-bit numbers are, in order, the eight
16-bit halves (low half first) of the four words of ``Philox4x32-10(key = (seed mod 2^32, seed >> 32),
counter = (c mod 2^32, c >> 32, 0, 0))`` for ``c = offset, offset + 1, ...``: number ``i`` of a draw is half
``i mod 8`` of counter ``offset + i // 8``. A draw of ``n`` numbers then advances ``offset`` by ``ceil(n / 8)``,
in place, on the device (:func:`advance`): no number is used twice, and no host read is needed.

The CUDA C twin of :func:`philox4x32_10` is ``PHILOX_CUDA`` in numformer/kernels/dropout.py; both are tested
against each other and against Random123's published known-answer vectors (tests/test_counter_rng.py).

Why a file of its own on the ground floor: the generator is one algorithm with its own published test vectors,
used by three floors (the backend's :class:`~numformer.backend.RandomState` holds the state, the dropout layer's
mask rule reads the stream, the GPU kernels compute it in CUDA and are tested against it); backend.py imports it,
and it imports nothing of numformer's. All arithmetic is on uint64 arrays holding 32-bit values (a 32 x 32-bit
product fits in 64 bits exactly), with operators only, so it is the same code on numpy and cupy.
"""
from __future__ import annotations

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57      # the multipliers (Salmon et al. 2011, Table 2)
W0, W1 = 0x9E3779B9, 0xBB67AE85      # the key's Weyl increments: golden ratio and sqrt(3) - 1, times 2^32
ROUNDS = 10
HALVES = 8                           # 16-bit numbers per counter: 4 words of 32 bits
# The constants as uint64 scalars, made once (the device path calls no numpy function: numpy scalars are what
# cupy takes as operands, and making them here keeps them out of the hot path).
_M0, _M1, _W0, _W1 = (np.uint64(x) for x in (M0, M1, W0, W1))
_MASK32, _MASK16 = np.uint64(0xFFFFFFFF), np.uint64(0xFFFF)
_SHIFT32, _SHIFT16, _ZERO = np.uint64(32), np.uint64(16), np.uint64(0)


def _mulhilo(m, a):
    """(high, low) 32-bit words of ``m * a`` (m, a: uint64 values below 2^32)."""
    product = m * a
    return product >> _SHIFT32, product & _MASK32


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0, c1, c2, c3) and key (k0, k1) -> its four 32-bit output words.

    Every argument is a uint64 array (or numpy uint64 scalar) of 32-bit values, broadcast together; the words
    come back as uint64 arrays of 32-bit values."""
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def new_state(xp, seed: int, offset: int = 0):
    """A stream's state, ``[seed, offset]`` as a (2,) uint64 array of ``xp`` (both taken mod 2^64)."""
    return xp.asarray([int(seed) % (1 << 64), int(offset) % (1 << 64)], dtype=xp.uint64)


def read_state(state) -> tuple[int, int]:
    """(seed, offset) of a state as host ints (one device-to-host copy: for checkpoints, not for a hot loop)."""
    host = state if type(state) is np.ndarray else state.get()  # cupy's device -> host copy
    return int(host[0]), int(host[1])


def counters(n: int) -> int:
    """How many counters a draw of ``n`` 16-bit numbers uses: ``ceil(n / 8)``."""
    return -(-int(n) // HALVES)


def bits16(xp, state, n: int):
    """The next ``n`` 16-bit numbers of the stream at ``state`` (a (n,) uint16 array of ``xp``): half
    ``i mod 8`` (low half first) of the words of counter ``offset + i // 8``. Does not advance the state."""
    count = counters(n)
    seed, c = state[0], state[1] + xp.arange(count, dtype=xp.uint64)  # the counter wraps mod 2^64
    words = philox4x32_10(c & _MASK32, c >> _SHIFT32, _ZERO, _ZERO, seed & _MASK32, seed >> _SHIFT32)
    halves = [h for w in words for h in (w & _MASK16, w >> _SHIFT16)]  # (low, high) of each word, in order
    return xp.stack(halves, axis=-1).reshape(-1)[:n].astype(xp.uint16)


def advance(state, n: int) -> None:
    """Move the state past a draw of ``n`` numbers: ``offset += ceil(n / 8)``, in place (a device operation on
    a device state: a captured graph replays it)."""
    state[1:] += state.dtype.type(counters(n))  # a uint64 scalar, as cupy takes it
