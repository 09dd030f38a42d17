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

import math
import sys

import numpy as np

from . import counter_rng, environment
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

    Two generators (``kind``):

    * ``"pcg64"``, the CPU's by default: ``numpy.random.Generator`` (PCG64), whose state is a plain dict that
      checkpoints store (``{"seed", "bit_generator"}``), so a resumed run draws the same masks.
    * ``"philox"``, the GPU's always (and the CPU's on request, ``generator="philox"``: it then draws the GPU's
      numbers exactly): the counter-based stream of :mod:`numformer.counter_rng` (Philox4x32-10). Its numbers
      are a pure function of (seed, offset, index); the state ``[seed, offset]`` is a (2,) uint64 array on the
      generator's device (:attr:`counter`) that each draw advances *on the device*, so a step captured once as
      a CUDA graph and replayed draws new masks, and drawing never waits for the device. Checkpoints store
      ``{"seed", "offset"}`` as host ints (portable: no device array in a checkpoint).

    How a mask is made from the numbers: :func:`numformer.layers.dropout.dropout_mask`.
    """

    GENERATORS = ("pcg64", "philox")

    def __init__(self, seed: int = 0, xp=np, generator: str = "pcg64"):
        if generator not in self.GENERATORS:
            raise BackendError(f"unknown generator {generator!r}: use {' or '.join(self.GENERATORS)}")
        self.seed = int(seed)
        self.xp = xp
        self.host_kind = generator  # the CPU's generator; the GPU's is always philox
        self.generator = self.counter = None
        self._restart(0)

    @property
    def kind(self) -> str:
        """"philox" on the GPU; on the CPU the generator asked for ("pcg64" unless told)."""
        return self.host_kind if self.xp is np else "philox"

    def _restart(self, offset: int) -> None:
        """Start the generator at the seed (and, for philox, at ``offset``)."""
        if self.kind == "philox":
            self.generator, self.counter = None, counter_rng.new_state(self.xp, self.seed, offset)
        else:
            self.generator, self.counter = np.random.default_rng(self.seed), None

    def to(self, xp) -> "RandomState":
        """Re-home the generator on another array module. A philox stream carries on where it was (one read of
        its offset); a switch between pcg64 and philox restarts from the seed."""
        if xp is not self.xp:
            offset = counter_rng.read_state(self.counter)[1] if self.counter is not None else 0
            self.xp = xp
            self._restart(offset if self.kind == "philox" else 0)
        return self

    def stream16(self, shape):
        """The next 16-bit numbers of the philox stream, as many as ``shape`` (an int or a tuple) holds, in C order
        (a uint16 array of ``shape`` on this generator's device), the offset advanced past them on the device
        (:func:`numformer.counter_rng.bits16`, ``advance``)."""
        if self.counter is None:
            raise BackendError("stream16 draws from the philox generator; this one is pcg64")
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
        n = math.prod(shape)
        bits = counter_rng.bits16(self.xp, self.counter, n)
        counter_rng.advance(self.counter, n)
        return bits.reshape(shape)

    def uniform(self, shape, dtype):
        """Uniform [0, 1) samples of ``shape`` on this generator's device. Philox: each sample is one 32-bit
        word ``w`` made of two 16-bit numbers of the stream (low half first): ``w / 2^32`` in float64,
        ``(w >> 8) / 2^24`` in float32."""
        if self.counter is None:
            return self.generator.random(shape, dtype=dtype)
        xp, n = self.xp, math.prod((shape,) if isinstance(shape, (int, np.integer)) else shape)
        halves = self.stream16((n, 2)).astype(xp.uint64)
        word = halves[:, 0] | (halves[:, 1] << np.uint64(16))
        if np.dtype(dtype) == np.float32:
            u = (word >> np.uint64(8)).astype(xp.float32) * np.float32(2.0 ** -24)
        else:
            u = word.astype(xp.float64) * 2.0 ** -32
        return u.astype(dtype).reshape(shape)

    def get_state(self) -> dict:
        """{"seed", "bit_generator"} (pcg64) or {"seed", "offset"} (philox): host values only."""
        if self.counter is not None:
            seed, offset = counter_rng.read_state(self.counter)
            return {"seed": self.seed, "offset": offset}
        return {"seed": self.seed, "bit_generator": self.generator.bit_generator.state}

    def set_state(self, state: dict) -> None:
        """Back to a state of :meth:`get_state` (or ``{"seed": s}``: the seed's start). Philox writes its device
        state in place (a captured graph keeps reading the same memory); a state of the other generator
        restarts from its seed."""
        self.seed = int(state["seed"])
        if self.counter is not None:
            self.counter[...] = counter_rng.new_state(self.xp, self.seed, int(state.get("offset", 0)))
        elif "bit_generator" in state:
            self.generator.bit_generator.state = state["bit_generator"]
        else:
            self.generator = np.random.default_rng(self.seed)


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
# None: device products are CuPy's ``@``; inside a captured training step's body, numformer's own cuBLAS handle's
# (numformer.kernels.gemm.owned_gemms: CuPy refuses every cuBLAS call while a stream captures)
_device_gemm = None


def product(a, b):
    """``a @ b`` of two arrays of two or more axes; device arrays on the installed device GEMM when one is (the
    captured step's own cuBLAS handle, :func:`numformer.kernels.gemm.owned_gemms`), else ``@``."""
    if _device_gemm is not None and is_cupy_array(a):
        return _device_gemm(a, b)
    return a @ b


def set_device_gemm(gemm):
    """Install ``gemm(a, b)`` as :func:`product`'s for device arrays (None: ``@``); returns the previous one."""
    global _device_gemm
    previous, _device_gemm = _device_gemm, gemm
    return previous


def matmul(a, b):
    """``a @ b``: a (m, k), b (k, n) -> (m, n), in the process's matmul arithmetic.

    fp32 (the default) is exactly ``a @ b`` (:func:`product`); the opt-in tf32 and fp16 modes of
    :mod:`numformer.precision` compute the same product with lower-precision operands.
    """
    return product(a, b) if _gemm is None else _gemm(a, b)


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
