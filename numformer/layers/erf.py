"""The error function, written in the backend's array operations, for the exact GELU (Hendrycks and Gimpel
2016: ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the standard normal's distribution function). Shapes: any -> same,
in the input's dtype (float32 or float64), accurate to a few units in the last place of that dtype.

``erf(z) = 2/sqrt(pi) * integral_0^z exp(-t^2) dt``, odd; ``erfc(z) = 1 - erf(z)``. Two expansions, each where
it converges fast, chosen by ``|z|`` against the split point ``A`` = 2:

* ``|z| <= A``, the series with all terms positive (no cancellation), from integrating
  ``exp(-t^2)`` against its own derivative term by term:
  ``erf(z) = 2/sqrt(pi) * z * exp(-z^2) * sum_n (2 z^2)^n / (1 * 3 * ... * (2n + 1))``;
* ``|z| >= A``, erfc by its continued fraction (Laplace's), in the even contraction whose partial
  denominators are ``z^2 + 2k + 1/2``:
  ``erfc(z) = z exp(-z^2) / sqrt(pi) / (z^2 + 1/2 - (1/2) / (z^2 + 5/2 - 3 / (z^2 + 9/2 - (15/2) / ...)))``,
  the k-th partial numerator ``k (2k - 1) / 2``; above ``Z_MAX`` = 30 erfc is 0 in float64 (it is
  below 1e-392), and the fraction is evaluated at most there (no overflow of z^2 for z up to infinity).

How many series terms and continued-fraction levels are taken is computed here, for each dtype, from that
dtype's epsilon at the split point, where both converge slowest (:func:`depths`): 30 and 27 for float64, 19
and 8 for float32. Both expansions are evaluated over the whole array on clipped arguments (no branches,
no masks: the same passes on NumPy and cupy), and ``where`` picks each entry's.

``exp(-z^2)`` is taken as ``exp(-h^2) * exp(-(z - h)(z + h))`` with ``h`` = z rounded to 1/64: ``h^2`` is exact,
so z^2's rounding (an error of z^2 ulps in the exponential, 600 at z = 25) never enters.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..backend import get_array_module

A = 2.0  # the split point between the series and the continued fraction (|z|)
Z_MAX = 30.0  # erfc(z) < 1e-392 beyond: the fraction is evaluated at min(z, Z_MAX)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@functools.lru_cache(maxsize=None)
def depths(dtype) -> tuple:
    """(series terms N, continued-fraction levels K) for ``dtype``: the fewest that bring the truncation
    below a quarter of the dtype's epsilon, relative, at the split point ``A`` (both converge slowest there)."""
    eps = float(np.finfo(dtype).eps) / 4
    t, term, total, n = 2 * A * A, 1.0, 1.0, 0
    while term > eps * total:  # the series: each term t / (2n + 1) times the one before
        n += 1
        term *= t / (2 * n + 1)
        total += term
    exact = _fraction(A, 400)
    k = 1
    while abs(_fraction(A, k) - exact) > eps * exact:
        k += 1
    return n, k


def _fraction(z: float, levels: int) -> float:
    """The continued fraction's denominator at depth ``levels``, for one Python float (used by :func:`depths`)."""
    z2, f = z * z, z * z + 2 * levels + 0.5
    for k in range(levels, 0, -1):
        f = z2 + 2 * (k - 1) + 0.5 - k * (2 * k - 1) / 2 / f
    return f


@functools.lru_cache(maxsize=None)
def _series_coefficients(n: int) -> tuple:
    """c_j = 1 / (1 * 3 * ... * (2j + 1)) for j = 0 .. n, each the float nearest the exact fraction."""
    from fractions import Fraction  # noqa: PLC0415

    out, c = [], Fraction(1)
    for j in range(n + 1):
        c /= 2 * j + 1 if j else 1
        out.append(float(c))
    return tuple(out)


def exp_minus_square(z):
    """exp(-z^2) = exp(-h^2) * exp(-(z - h)(z + h)), h = z rounded to a multiple of 1/64 (h^2 exact)."""
    xp = get_array_module(z)
    h = xp.round(z * 64) / 64
    return xp.exp(-h * h) * xp.exp(-(z - h) * (z + h))


def series_sum(z, n: int):
    """sum_{j<=n} t^j / (1 * 3 * ... * (2j + 1)), t = 2 z^2: Horner in place, every term positive.
    erf(z) = 2/sqrt(pi) * z exp(-z^2) * this, for 0 <= z <= A."""
    t = 2 * z * z
    c = _series_coefficients(n)
    total = t * c[n] + c[n - 1]
    for j in range(n - 2, -1, -1):  # sum_j c_j t^j = c_0 + t (c_1 + t (c_2 + ...)), c_j = 1 / (2j + 1)!!
        total *= t
        total += c[j]
    return total


def fraction_denominator(z, k: int):
    """The continued fraction's denominator at depth k, f = z^2 + 1/2 - (1/2) / (z^2 + 5/2 - 3 / (...)),
    the j-th level z^2 + 2j + 1/2 and numerator j (2j - 1) / 2, in place from level k up.
    erfc(z) = z exp(-z^2) / sqrt(pi) / f, for A <= z <= Z_MAX."""
    xp = get_array_module(z)
    z2 = z * z
    f = z2 + (2 * k + 0.5)
    for j in range(k, 0, -1):  # f <- z^2 + 2(j - 1) + 1/2 - j (2j - 1) / 2 / f
        xp.divide(-(j * (2 * j - 1) / 2), f, out=f)
        f += z2
        f += 2 * (j - 1) + 0.5
    return f


def erf_and_erfc_of_abs(x):
    """(erf(|x|) where |x| <= A, erfc(|x|) where |x| > A, [|x| <= A]): both expansions evaluated on every entry
    with their argument clipped to their range, sharing z exp(-z^2) (an entry's other value is discarded)."""
    xp = get_array_module(x)
    n, k = depths(x.dtype)
    z = xp.minimum(xp.abs(x), Z_MAX)
    small = z <= A
    p = z * exp_minus_square(z)
    below = (TWO_OVER_SQRT_PI * p) * series_sum(xp.minimum(z, A), n)
    above = (0.5 * TWO_OVER_SQRT_PI * p) / fraction_denominator(xp.maximum(z, A), k)
    return below, above, small


def erf(x):
    """erf(x), odd: erf(|x|) from the series up to A, 1 - erfc(|x|) beyond; the sign of x put back. x's dtype."""
    xp = get_array_module(x)
    below, above, small = erf_and_erfc_of_abs(x)
    return xp.copysign(xp.where(small, below, 1 - above), x)


def erfc(x):
    """erfc(x) = 1 - erf(x): 1 - erf(|x|) up to A (accurate to ulp(1) absolute), the continued fraction
    beyond (accurate relative to its own size, however tiny); erfc(-|x|) = 2 - erfc(|x|). x's dtype."""
    xp = get_array_module(x)
    below, above, small = erf_and_erfc_of_abs(x)
    tail = xp.where(small, 1 - below, above)
    return xp.where(x >= 0, tail, 2 - tail)
