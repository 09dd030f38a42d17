"""The worst error each tolerance-based suite measured in this pytest run, by key.

A test calls :func:`record_worst` with every error it compares against a bound; the
conftest prints one line per key at the end of the run ("worst error <key> = ...") and
stores the table in the pytest cache under ``numformer/worst_error``, where
``tests/cpu_matrix.py`` reads it back for each CPU configuration it runs.
"""
from __future__ import annotations

WORST: dict[str, tuple[float, str]] = {}  # key -> (worst value, where it was measured)
CACHE_KEY = "numformer/worst_error"


def record_worst(key: str, value: float, where: str) -> None:
    """Keep ``value`` as the worst of ``key`` if it is larger than what was seen (NaN counts as worst)."""
    value = float(value)
    if key not in WORST or not value <= WORST[key][0]:
        WORST[key] = (value, where)


def summary_lines() -> list[str]:
    return [f"worst error {k} = {v:.3g} ({where})" for k, (v, where) in sorted(WORST.items())]
