"""A factor named by what it equals in every case: ``d``, ``1/n``, ``sqrt(d_k)``, ``1/scale^2``, a constant.

When the student's intermediate is ``c`` times numformer's and ``c`` differs by case (8, 16 and 3: the features
of each case's LayerNorm), one number says nothing; the factor is named when one expression of the exercise's
sizes (``Exercise.symbols``, functions of the reference's arguments) and scalar arguments (``scale``) equals it
in every call of every case, and not named at all otherwise: a name that fits one case only could be chance.
"""
from __future__ import annotations

import itertools
import math

_CONSTANTS = {"2": 2.0, "1/2": 0.5, "3": 3.0, "1/3": 1 / 3, "4": 4.0, "1/4": 0.25}


def symbol_values(ex, args: dict) -> dict:
    """{name: value} of the sizes the exercise names and the scalar arguments, in one call (positive only)."""
    values = {}
    for name, fn in ex.symbols.items():
        try:
            values[name] = float(fn(args))
        except Exception:  # noqa: BLE001  (a symbol this call's arguments do not define)
            continue
    for name, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in values:
            values[name] = float(value)
    return {k: v for k, v in values.items() if v > 0}


def expressions(symbols: list) -> list:
    """(name, function of the symbols' values) for each symbol and the expressions of one or two of them."""
    out = []
    for s in symbols:
        out += [(s, lambda v, s=s: v[s]), (f"1/{s}", lambda v, s=s: 1 / v[s]),
                (f"sqrt({s})", lambda v, s=s: math.sqrt(v[s])), (f"1/sqrt({s})", lambda v, s=s: 1 / math.sqrt(v[s])),
                (f"{s}^2", lambda v, s=s: v[s] ** 2), (f"1/{s}^2", lambda v, s=s: 1 / v[s] ** 2)]
    for a, b in itertools.combinations(symbols, 2):
        out += [(f"{a}*{b}", lambda v, a=a, b=b: v[a] * v[b]), (f"{a}/{b}", lambda v, a=a, b=b: v[a] / v[b]),
                (f"{b}/{a}", lambda v, a=a, b=b: v[b] / v[a]), (f"1/({a}*{b})", lambda v, a=a, b=b: 1 / (v[a] * v[b]))]
    return out


def name_factor(ex, factors: list, calls: list):
    """What the factors ``c_k`` of the calls ``calls`` (their arguments) equal in every call: a constant ("2",
    "-1"), a symbol of the exercise or an expression of them ("d", "sqrt(d_k)", "1/n"); None when nothing fits
    every call (a factor named from one case alone could be a coincidence)."""
    if any(c == 0 for c in factors) or (any(c < 0 for c in factors) and not all(c < 0 for c in factors)):
        return None
    sign = "-" if factors[0] < 0 else ""
    mags = [abs(c) for c in factors]
    if all(abs(m - 1) <= 1e-9 for m in mags):
        return "-1" if sign else None
    for name, value in _CONSTANTS.items():
        if all(abs(m - value) <= 1e-9 * value for m in mags):
            return sign + name
    values = [symbol_values(ex, call.args) for call in calls]
    common = [s for s in values[0] if all(s in v for v in values)]
    for name, fn in expressions(common):
        try:
            if all(abs(fn(v) - m) <= 1e-9 * m for v, m in zip(values, mags)):
                return sign + name
        except (ZeroDivisionError, ValueError):
            continue
    return None

