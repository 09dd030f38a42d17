"""Array backend: numpy on the CPU, cupy on NVIDIA GPUs, one code path for both.

Every layer finds its array module from its inputs with :func:`get_array_module`
(Chainer's pattern), so the same ``forward``/``backward`` runs on either device.
cupy is imported only when a CUDA device is asked for, so numformer installs and
runs on machines without it.

Also here: the dtype policy (float32 by default, float64 for gradient checks),
the per-model random generator, host<->device copies, and the one scatter-add
that numpy and cupy spell differently. Nothing here is about speed: host threads,
blocked passes and allocator tuning live in :mod:`numformer.kernels`.
"""
from __future__ import annotations

import sys

import numpy as np

from . import environment
from .errors import NumformerError

DEFAULT_DTYPE = np.float32
# The score a masked key gets before the softmax (Eq. 1, Section 3.2.3): large, finite and negative, so a row
# whose every key is masked is uniform, not NaN. Here, not in layers/attention.py, because the plain math
# and its fast twin (numformer.kernels.attention) must fill the same value, and the machinery never imports
# the math.
MASKED_SCORE = -1e9
_DTYPES = {"float32": np.float32, "float64": np.float64}

_cupy = None  # the cupy module once a CUDA device has been asked for


class BackendError(NumformerError, RuntimeError):
    """A device or dtype request that cannot be met; the message says what to do."""


def resolve_dtype(dtype) -> np.dtype:
    """'float32' / 'float64' / a numpy dtype -> numpy dtype; anything else is an error."""
    if dtype is None:
        return np.dtype(DEFAULT_DTYPE)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise BackendError(f"unknown dtype {dtype!r}: use float32 or float64") from None
    if dt.name not in _DTYPES:
        raise BackendError(f"unsupported dtype {dt.name}: use float32 or float64")
    return dt


def resolve_device(device: str | None = None) -> str:
    """The device to use: the argument, else $NUMFORMER_DEVICE, else 'cpu'.

    Accepted: 'cpu', 'cuda', 'cuda:N' (also 'gpu' as an alias of 'cuda').
    """
    device = device or environment.device() or "cpu"
    device = device.strip().lower()
    if device == "gpu":
        device = "cuda"
    if device == "cpu" or device == "cuda":
        return device
    if device.startswith("cuda:") and device[5:].isdigit():
        return device
    raise BackendError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


def import_cupy():
    """Import cupy on first use, checking that a GPU is really there.

    Raises BackendError with a one-line message saying what to install or check.
    """
    global _cupy
    if _cupy is not None:
        return _cupy
    try:
        import cupy  # noqa: PLC0415  (lazy on purpose: cupy is optional)
    except ImportError:
        raise BackendError(
            "device 'cuda' needs cupy: pip install 'numformer[gpu]' (cupy-cuda12x), or use --device cpu"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError when no driver or no GPU
        raise BackendError(f"cupy is installed but no CUDA GPU is usable ({exc}); use --device cpu") from None
    if count < 1:
        raise BackendError("cupy is installed but no CUDA GPU was found; use --device cpu")
    _cupy = cupy
    return cupy


def xp_for(device: str | None):
    """The array module (numpy or cupy) for a device string; selects the GPU for 'cuda:N'."""
    device = resolve_device(device)
    if device == "cpu":
        return np
    cupy = import_cupy()
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= cupy.cuda.runtime.getDeviceCount():
        raise BackendError(f"no GPU {index}: this machine has {cupy.cuda.runtime.getDeviceCount()}")
    cupy.cuda.Device(index).use()
    return cupy


def get_array_module(*arrays):
    """cupy if any argument is a cupy array, numpy otherwise (works without CUDA)."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return np


def is_cupy_array(a) -> bool:
    return _cupy is not None and isinstance(a, _cupy.ndarray)


def to_host(a) -> np.ndarray:
    """A numpy copy-or-view of a numpy or cupy array (checkpoints hold these)."""
    if is_cupy_array(a):
        return a.get()
    return np.asarray(a)


def to_xp(a, xp, dtype=None):
    """Move an array to the array module ``xp`` (numpy or cupy), optionally casting."""
    if xp is np:
        out = to_host(a)
        return out.astype(dtype, copy=False) if dtype is not None else out
    return xp.asarray(a, dtype=dtype)


def scatter_add(target, index, values):
    """``target[index[i]] += values[i]``, repeated indices summed (the embedding's backward).

    target (V, d); index (n,) int; values (n, d). numpy spells it ``np.add.at``, cupy
    ``cupyx.scatter_add`` (atomic adds on the GPU).
    """
    if is_cupy_array(target):
        import cupyx  # noqa: PLC0415  (only reached with cupy arrays)

        cupyx.scatter_add(target, index, values)
    else:
        np.add.at(target, index, values)
    return target


class RandomState:
    """One seeded generator per model: dropout masks come from here.

    On the CPU it wraps ``numpy.random.Generator`` (PCG64), whose state is a plain
    dict that checkpoints store, so a resumed run draws the same masks.
    On the GPU it wraps ``cupy.random.Generator`` seeded from the same seed.
    How a mask is made from its bits: :func:`numformer.layers.dropout.dropout_mask`.
    """

    def __init__(self, seed: int = 0, xp=np):
        self.seed = int(seed)
        self.xp = xp
        self.generator = xp.random.default_rng(self.seed)

    def to(self, xp) -> "RandomState":
        """Re-home the generator on another array module (state restarts from the seed on a switch)."""
        if xp is not self.xp:
            self.xp = xp
            self.generator = xp.random.default_rng(self.seed)
        return self

    def uniform(self, shape, dtype):
        """Uniform [0, 1) samples of ``shape`` on this generator's device."""
        return self.generator.random(shape, dtype=dtype)

    def get_state(self) -> dict:
        if self.xp is np:
            return {"seed": self.seed, "bit_generator": self.generator.bit_generator.state}
        return {"seed": self.seed}

    def set_state(self, state: dict) -> None:
        self.seed = int(state["seed"])
        if self.xp is np and "bit_generator" in state:
            self.generator.bit_generator.state = state["bit_generator"]
        else:
            self.generator = self.xp.random.default_rng(self.seed)


def describe(xp) -> str:
    """A one-line description of the array module and its BLAS/GPU, for logs and benchmarks."""
    if xp is np:
        return f"numpy {np.__version__} (python {sys.version.split()[0]})"
    dev = xp.cuda.Device()
    name = xp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    return f"cupy {xp.__version__} on {name}"


# -- the GEMM --------------------------------------------------------------------------------------
_gemm = None  # None: plain ``a @ b``; else the lower-precision product numformer.precision set


def matmul(a, b):
    """``a @ b``: a (m, k), b (k, n) -> (m, n), in the process's matmul arithmetic.

    fp32 (the default) is exactly ``a @ b``; the opt-in tf32 and fp16 modes of
    :mod:`numformer.precision` compute the same product with lower-precision operands.
    """
    return a @ b if _gemm is None else _gemm(a, b)


def set_gemm(product) -> None:
    """Install ``product(a, b)`` as the GEMM of :func:`matmul` (None: plain ``a @ b``); called by
    :func:`numformer.precision.set_matmul_precision` only."""
    global _gemm
    _gemm = product


def read_scalars(xp, *values) -> list[float]:
    """Device scalars (0-d arrays or numbers) -> host floats, in one device-to-host copy.

    Each separate ``float(x)`` of a device value waits for the device; stacking them first
    makes it one wait (and one transfer) for all of them.
    """
    return [float(v) for v in to_host(xp.stack([xp.asarray(v, dtype=xp.float64).reshape(()) for v in values]))]
