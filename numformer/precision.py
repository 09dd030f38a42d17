"""Opt-in lower-precision matmuls: TF32, and fp16 with float32 master weights (the machinery behind
:func:`numformer.backend.matmul`; the fp16 loss scaler is :mod:`numformer.training.loss_scaling`).

The big GEMMs of the model, those of :class:`~numformer.layers.linear.Linear` (forward,
dW, dX), :class:`~numformer.layers.projection.OutputProjection` (logits, dW, dH) and the
projections of :class:`~numformer.layers.attention.MultiHeadAttention` (its Linear children), call
:func:`numformer.backend.matmul` instead of ``@``. A process-wide mode, set here, decides what it computes:

* ``"fp32"`` (the default): plain ``a @ b``. The only cost over ``@`` is one function
  call and one module-global test; results are bit-identical.
* ``"fp16"``: both float32 operands are rounded to float16, multiplied with float32
  accumulation, and the product comes back as float32 (Micikevicius et al. 2018,
  "Mixed Precision Training"). Weights stay float32 (the master copy: Adam updates
  them in float32); only the GEMM's operands are cast, for that GEMM alone. Every
  output and gradient is float32, so softmax, LayerNorm, the loss and Adam run in
  float32 as before. Gradients small enough to underflow float16 need
  :class:`~numformer.training.loss_scaling.DynamicLossScaler`.
* ``"tf32"``: float32 GEMMs on NVIDIA tensor cores (Ampere or newer) with operands
  rounded to TF32 (10-bit mantissa, float32's range), results float32. cupy only:
  on numpy arrays it is an error, never a silent no-op. It is cupy's process-wide
  compute type for float32 matrix products (like ``torch.backends.cuda.matmul.allow_tf32``),
  so it also reaches 2-D products outside ``backend.matmul`` (LayerNorm's row-mean GEMVs);
  cupy's batched matmul (attention's per-head products) does not consult it in the
  cupy sources read, so those stay float32.

Never on by default and never switched on by an environment variable of numformer's
own: only :func:`set_matmul_precision` (or the :func:`matmul_precision` context) sets it.
The modes touch float32 operands only: float64 GEMMs (the gradient checks) are exact
whatever the mode.

Why fp16 and not bf16: numpy has no bfloat16 dtype, and cupy 13 (which numformer
supports) has none either; later cupy adds an experimental one through the optional
``ml_dtypes`` package. bf16 would need no loss scaling (float32's exponent range) but
keeps fewer significand bits (8) than fp16 (11).
fp16 has a narrow range (largest 65504, smallest normal 6.1e-5, smallest subnormal
6.0e-8), hence the loss scaler.

How the GEMM is computed:

* cupy: ``cupy.matmul`` of two float16 arrays runs ``cublasGemmEx`` with
  ``CUBLAS_COMPUTE_32F`` (float32 accumulation; tensor cores from sm_70) and a float16
  result, which is cast to float32. The float16 result rounds like the operands and
  saturates to inf above 65504: the overflow the loss scaler detects and backs off from.
* numpy (no fp16 GEMM in BLAS; numpy's own float16 matmul is a slow loop): the same
  arithmetic emulated: operands rounded to float16 and back, one float32 BLAS GEMM
  (the products of two 11-bit significands are exact in float32's 24), result rounded
  to float16 and back. Correct, not fast: it is there so the CPU tests check what the GPU
  computes (up to summation order), not to speed up CPU training.

The weights' float16 copies, once a step (issue 60, item 4): the per-GEMM cast above rounds every weight to
float16 at every GEMM that uses it (forward and dX, in every accumulated batch). Mixed precision as
Micikevicius et al. (2018, Section 3) describe it keeps one float16 copy of the float32 master weights, made
after each update. :func:`half_weights` does that for a training step: on entry it casts each float32 array
of the parameter buffer to float16 once; inside, an operand of the fp16 GEMM that is a view of the master
weights (``w``, ``w.T``: found by its address in the buffer) is taken as the same view of the copy. The
values are those the per-GEMM cast gives (a cast is a cast), so the step's results are bit for bit the same;
only the casts are fewer. Outside the context (validation, decoding, tests) each GEMM casts as before.

TF32 in cupy: ``CUPY_TF32=1`` in the environment makes cupy pick the TF32 compute type
the first time it runs a float32 GEMM (``cupy._core._routines_linalg.get_compute_type``
reads it then). :func:`set_matmul_precision` sets the variable, and if cupy is already
imported resets cupy's cached float32 compute type so that it is read again; a cupy
without that internal raises, asking to set the mode before the model moves to the GPU.
Leaving ``"tf32"`` restores the variable and resets the cache the same way.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np

from . import backend, environment
from .backend import get_array_module, is_cupy_array, resolve_device
from .errors import NumformerError

MODES = ("fp32", "tf32", "fp16")
_F32 = np.dtype(np.float32)

_mode = "fp32"
_cupy_tf32_on = False     # whether "tf32" set CUPY_TF32 (and must give it back)
_cupy_tf32_before = None  # the CUPY_TF32 value before that (None: unset)


class PrecisionError(NumformerError, ValueError):
    """A precision request that cannot be met; the message says what to do."""


# -- the GEMM ----------------------------------------------------------------------------
def _matmul_fp16(a, b):
    """fp16 GEMM of two float32 operands, float32 result (anything else: exact ``a @ b``)."""
    if a.dtype != _F32 or b.dtype != _F32:
        return a @ b  # float64 (gradient checks) is never downcast
    xp = get_array_module(a, b)
    if is_cupy_array(a) or is_cupy_array(b):
        # cuBLAS: float16 in, CUBLAS_COMPUTE_32F, float16 out; astype keeps a transposed
        # view's order, which cuBLAS takes as a transpose flag (no extra copy)
        return backend.product(_half(a), _half(b)).astype(xp.float32)
    f32 = xp.float32
    # casting to float16 warns on overflow (inf) and underflow (0): both are the point here
    with xp.errstate(over="ignore", under="ignore"):
        c = _half(a).astype(f32) @ _half(b).astype(f32)
        return c.astype(xp.float16).astype(f32)


# -- the weights' float16 copies, once a step ----------------------------------------------------
_copies = []  # (address of a master float32 array, its size, its float16 copy) while half_weights is entered
half_casts = 0  # float16 casts of GEMM operands made (copies included): what a test counts


def _address(a) -> int:
    pointer = getattr(a.data, "ptr", None)  # cupy: the device pointer (numpy's .data is a memoryview)
    return pointer if pointer is not None else a.__array_interface__["data"][0]


def _half(a):
    """``a`` in float16: the same view of the weights' copy when ``a`` views the master weights, else a cast."""
    global half_casts
    if _copies:
        start = _address(a)
        for base, size, copy in _copies:
            offset = start - base
            if 0 <= offset < size * 4 and type(copy) is type(a):
                xp = get_array_module(copy)
                view = xp.lib.stride_tricks.as_strided(copy[offset // 4:], shape=a.shape,
                                                       strides=tuple(s // 2 for s in a.strides))
                return view
    half_casts += 1
    return a.astype(get_array_module(a).float16)


@contextlib.contextmanager
def half_weights(buffer):
    """Inside: fp16 GEMMs take the weights of ``buffer`` (a ParameterBuffer) from float16 copies made once, on
    entry. A no-op unless the matmul precision is fp16. The weights must not change inside (a training step's
    forward and backward: Adam runs after it)."""
    global half_casts
    if _mode != "fp16" or _copies:
        yield
        return
    for data in buffer.data:
        if data.dtype == _F32:
            xp = get_array_module(data)
            with xp.errstate(over="ignore", under="ignore") if xp is np else contextlib.nullcontext():
                _copies.append((_address(data), data.size, data.astype(xp.float16)))
            half_casts += 1
    try:
        yield
    finally:
        _copies.clear()


def _matmul_tf32(a, b):
    """``a @ b`` with cuBLAS in TF32; on host float32 arrays an error (TF32 is a GPU mode)."""
    if a.dtype == _F32 and not (is_cupy_array(a) or is_cupy_array(b)):
        raise PrecisionError("matmul precision 'tf32' needs --device cuda (TF32 runs on NVIDIA tensor cores); "
                             "on the CPU use fp32")
    return backend.product(a, b)


# -- the mode --------------------------------------------------------------------------
def get_matmul_precision() -> str:
    """The current mode: 'fp32', 'tf32' or 'fp16'."""
    return _mode


def _check_mode(mode) -> str:
    m = str(mode).strip().lower()
    m = {"float32": "fp32", "float16": "fp16", "half": "fp16", "tensorfloat32": "tf32"}.get(m, m)
    if m in ("bf16", "bfloat16"):
        raise PrecisionError("matmul precision 'bf16' is not available: numpy has no bfloat16 dtype (nor has "
                             "cupy 13); use fp16 (with the dynamic loss scaler) or tf32")
    if m not in MODES:
        raise PrecisionError(f"unknown matmul precision {mode!r}: use one of {', '.join(MODES)}")
    return m


def check_precision(mode: str, device: str | None = None) -> str:
    """The canonical name of ``mode``; PrecisionError (one line) when it cannot run on ``device``."""
    m = _check_mode(mode)
    if m == "tf32" and device is not None and resolve_device(device) == "cpu":
        raise PrecisionError("--precision tf32 needs --device cuda (TF32 runs on NVIDIA tensor cores): "
                             "on a CPU use fp32")
    return m


def _reset_cupy_fp32_compute_type() -> None:
    """Make an imported cupy re-read CUPY_TF32 at its next float32 GEMM (its choice is cached)."""
    if "cupy" not in sys.modules:
        return  # read when cupy is first used: the environment variable is enough
    try:
        from cupy._core import _routines_linalg  # noqa: PLC0415  (cupy internals; only with cupy loaded)

        _routines_linalg.set_compute_type(np.float32, _routines_linalg.COMPUTE_TYPE_TBD)
    except (ImportError, AttributeError):
        raise PrecisionError("this cupy cannot change the TF32 setting after it is imported: set the matmul "
                             "precision before the model is moved to the GPU (or set CUPY_TF32 yourself)") from None


def _set_cupy_tf32(on: bool) -> None:
    """Turn cupy's TF32 GEMMs on (CUPY_TF32=1) or back to what the environment said before."""
    global _cupy_tf32_before, _cupy_tf32_on
    if on:
        _cupy_tf32_before, _cupy_tf32_on = environment.set_cupy_tf32("1"), True
        try:
            _reset_cupy_fp32_compute_type()
        except PrecisionError:
            environment.set_cupy_tf32(_cupy_tf32_before)  # refused: leave the process as it was
            _cupy_tf32_on = False
            raise
    elif _cupy_tf32_on:
        environment.set_cupy_tf32(_cupy_tf32_before)
        _cupy_tf32_on = False
        _reset_cupy_fp32_compute_type()
    # else tf32 was never on: cupy's state is untouched


def set_matmul_precision(mode: str, device: str | None = None) -> str:
    """Set the process-wide matmul precision; returns the previous mode.

    mode: 'fp32' (default), 'tf32' or 'fp16' (aliases 'float32', 'float16', 'half').
    device: the training device ('cpu', 'cuda', 'cuda:N'), if known: 'tf32' with a
    CPU device is refused here, before any work (otherwise at the first float32 GEMM
    on host arrays). Call it before the model is moved to the GPU when using 'tf32'.
    'fp16' works on the CPU too, emulated and slower than fp32 (for tests).
    """
    global _mode
    m = check_precision(mode, device)
    previous = _mode
    if m != previous:
        _set_cupy_tf32(m == "tf32")
    _mode = m
    backend.set_gemm({"fp32": None, "fp16": _matmul_fp16, "tf32": _matmul_tf32}[m])
    return previous


@contextlib.contextmanager
def matmul_precision(mode: str, device: str | None = None):
    """``with matmul_precision('fp16'): ...`` sets the mode for the block, then restores the previous one."""
    previous = set_matmul_precision(mode, device)
    try:
        yield
    finally:
        set_matmul_precision(previous)
