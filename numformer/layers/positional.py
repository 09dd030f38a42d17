"""Sinusoidal positional encoding (Section 3.5).

``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))``, ``PE(pos, 2i+1) = cos(...)``,
added to the embeddings. Shapes: x (batch, time, d_model) -> same. The table is a
buffer (moves with the model, is not trained); backward is the identity, and so are forward mode
(``y_dot = x_dot``) and the backward's tangent.
"""
from __future__ import annotations

import numpy as np

from ..backend import DEFAULT_DTYPE, get_array_module
from ..module import Module
from .registry import registered


def sinusoid_table(max_len: int, d_model: int) -> np.ndarray:
    """(max_len, d_model) float64 table of Section 3.5, sin on even and cos on odd columns."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    i2 = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, i2 / d_model)
    table = np.zeros((max_len, d_model), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return table


def check_positions(n: int, max_len: int) -> None:
    """ValueError (one line) unless ``n`` positions fit a table of ``max_len`` rows; shared with the learned table."""
    if n > max_len:
        raise ValueError(f"sequence of {n} positions exceeds the positional table ({max_len}); "
                         "raise max_len in the model config")


@registered
class PositionalEncoding(Module):
    """x + PE[offset : offset + time]; ``offset`` is used by incremental decoding."""

    kinks = False  # adds a constant table (Module.kinks: the layer contract)

    def __init__(self, d_model: int, max_len: int = 1024, dtype=DEFAULT_DTYPE):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("table", sinusoid_table(max_len, d_model).astype(dtype))

    def forward(self, x, offset: int = 0):
        """x (batch, time, d_model) -> x + PE rows offset..offset+time-1."""
        t = x.shape[-2]
        check_positions(offset + t, self.max_len)
        xp = get_array_module(x)
        out = x + xp.asarray(self.table[offset: offset + t], dtype=x.dtype)
        return out

    def backward(self, dy):
        """The table is constant: dL/dx = dL/dy."""
        return dy

    def jvp(self, x_dot):
        """The table is constant: y_dot = x_dot."""
        return x_dot

    def backward_jvp(self, dy, dy_dot):
        return dy, dy_dot
