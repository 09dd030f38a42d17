"""Opt-in lower-precision matmuls (TF32, fp16 with float32 master weights) and dynamic loss scaling.

The big GEMMs of the model, those of :class:`~numformer.layers.linear.Linear` (forward,
dW, dX), :class:`~numformer.layers.projection.OutputProjection` (logits, dW, dH) and the
projections of :class:`~numformer.layers.attention.MultiHeadAttention` (its Linear children), call
:func:`matmul` instead of ``@``. A process-wide mode decides what it computes:

* ``"fp32"`` (the default): plain ``a @ b``. The only cost over ``@`` is one function
  call and one module-global test; results are bit-identical.
* ``"fp16"``: both float32 operands are rounded to float16, multiplied with float32
  accumulation, and the product comes back as float32 (Micikevicius et al. 2018,
  "Mixed Precision Training"). Weights stay float32 (the master copy: Adam updates
  them in float32); only the GEMM's operands are cast, for that GEMM alone. Every
  output and gradient is float32, so softmax, LayerNorm, the loss and Adam run in
  float32 as before. Gradients small enough to underflow float16 need
  :class:`DynamicLossScaler`.
* ``"tf32"``: float32 GEMMs on NVIDIA tensor cores (Ampere or newer) with operands
  rounded to TF32 (10-bit mantissa, float32's range), results float32. cupy only:
  on numpy arrays it is an error, never a silent no-op. It is cupy's process-wide
  compute type for float32 matrix products (like ``torch.backends.cuda.matmul.allow_tf32``),
  so it also reaches 2-D products outside :func:`matmul` (LayerNorm's row-mean GEMVs);
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

TF32 in cupy: ``CUPY_TF32=1`` in the environment makes cupy pick the TF32 compute type
the first time it runs a float32 GEMM (``cupy._core._routines_linalg.get_compute_type``
reads it then). :func:`set_matmul_precision` sets the variable, and if cupy is already
imported resets cupy's cached float32 compute type so that it is read again; a cupy
without that internal raises, asking to set the mode before the model moves to the GPU.
Leaving ``"tf32"`` restores the variable and resets the cache the same way.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys

import numpy as np

from .errors import NumformerError
from .backend import get_array_module, is_cupy_array, resolve_device

MODES = ("fp32", "tf32", "fp16")
_F32 = np.dtype(np.float32)

_mode = "fp32"
_special = None          # None in fp32 mode: matmul is then ``a @ b`` after one test
_saved_cupy_tf32 = None  # the CUPY_TF32 value before "tf32" set it (None: unset)
_NOT_SAVED = object()


class PrecisionError(NumformerError, ValueError):
    """A precision request that cannot be met; the message says what to do."""


# -- the GEMM --------------------------------------------------------------------------
def matmul(a, b):
    """``a @ b`` under the current matmul precision. a (m, k), b (k, n) -> (m, n), float32 for float32 inputs.

    fp32 (default): exactly ``a @ b``. fp16: float16 operands, float32 accumulation,
    float32 result (see the module docstring). tf32: ``a @ b``, with cuBLAS set to TF32.
    Operands that are not both float32 (float64 in gradient checks) always get ``a @ b``.
    """
    if _special is None:
        return a @ b
    return _special(a, b)


def _matmul_fp16(a, b):
    """fp16 GEMM of two float32 operands, float32 result (anything else: exact ``a @ b``)."""
    if a.dtype != _F32 or b.dtype != _F32:
        return a @ b  # float64 (gradient checks) is never downcast
    xp = get_array_module(a, b)
    if is_cupy_array(a) or is_cupy_array(b):
        # cuBLAS: float16 in, CUBLAS_COMPUTE_32F, float16 out; astype keeps a transposed
        # view's order, which cuBLAS takes as a transpose flag (no extra copy)
        f16 = xp.float16
        return xp.matmul(a.astype(f16), b.astype(f16)).astype(xp.float32)
    f16, f32 = xp.float16, xp.float32
    # casting to float16 warns on overflow (inf) and underflow (0): both are the point here
    with xp.errstate(over="ignore", under="ignore"):
        c = a.astype(f16).astype(f32) @ b.astype(f16).astype(f32)
        return c.astype(f16).astype(f32)


def _matmul_tf32(a, b):
    """``a @ b`` with cuBLAS in TF32; on host float32 arrays an error (TF32 is a GPU mode)."""
    if a.dtype == _F32 and not (is_cupy_array(a) or is_cupy_array(b)):
        raise PrecisionError("matmul precision 'tf32' needs --device cuda (TF32 runs on NVIDIA tensor cores); "
                             "on the CPU use fp32")
    return a @ b


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


def _restore_cupy_tf32_env() -> None:
    global _saved_cupy_tf32
    if _saved_cupy_tf32 is _NOT_SAVED:
        os.environ.pop("CUPY_TF32", None)
    else:
        os.environ["CUPY_TF32"] = _saved_cupy_tf32
    _saved_cupy_tf32 = None


def _set_cupy_tf32(on: bool) -> None:
    """Turn cupy's TF32 GEMMs on (CUPY_TF32=1) or back to what the environment said before."""
    global _saved_cupy_tf32
    if on:
        _saved_cupy_tf32 = os.environ.get("CUPY_TF32", _NOT_SAVED)
        os.environ["CUPY_TF32"] = "1"
        try:
            _reset_cupy_fp32_compute_type()
        except PrecisionError:
            _restore_cupy_tf32_env()  # refused: leave the process as it was
            raise
    elif _saved_cupy_tf32 is not None:
        _restore_cupy_tf32_env()
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
    global _mode, _special
    m = check_precision(mode, device)
    previous = _mode
    if m != previous:
        _set_cupy_tf32(m == "tf32")
    _mode = m
    _special = {"fp32": None, "fp16": _matmul_fp16, "tf32": _matmul_tf32}[m]
    return previous


@contextlib.contextmanager
def matmul_precision(mode: str, device: str | None = None):
    """``with matmul_precision('fp16'): ...`` sets the mode for the block, then restores the previous one."""
    previous = set_matmul_precision(mode, device)
    try:
        yield
    finally:
        set_matmul_precision(previous)


# -- dynamic loss scaling ------------------------------------------------------------------
class DynamicLossScaler:
    """Dynamic loss scaling for fp16 GEMMs (Micikevicius et al. 2018; ``torch.cuda.amp.GradScaler``).

    Gradients of a Transformer are often below float16's smallest subnormal (6e-8) and
    would round to zero when a GEMM casts them. Backward is therefore seeded with the loss
    gradient times ``scale`` (a power of two: scaling and unscaling are exact in binary
    floating point), which lifts every gradient by the same factor; the parameter
    gradients (float32) are divided by ``scale`` before anything reads them. If the
    scaled gradients overflowed float16 (inf or nan somewhere), the step is skipped and
    ``scale`` halves; after ``growth_interval`` consecutive good steps it doubles.

    Host state only (Python floats): nothing here forces a device sync. The one finite
    check is the trainer's own (``math.isfinite(float(gnorm))`` on the global grad norm).

    How the trainer uses it, per optimizer step (fp16 mode only: fp32 and tf32 keep
    float32's range and need no scaler)::

        set_matmul_precision("fp16", device)          # once, before training
        scaler = DynamicLossScaler()                  # or load_state_dict(...) on resume

        for batch in step_batches:                     # forward/backward as before
            loss = crit.forward(model(src, tgt_in), tgt_out, normalizer=n_tokens)  # true loss
            model.backward(scaler.scale_grad_(crit.backward()))  # seed backward with scale * dL/dlogits
        scaler.unscale_(params)                        # true gradients, before norm and clipping
        gnorm = clip_grad_norm(params, clip)           # or grad_norm(params)
        loss_ok = math.isfinite(float(loss))
        if scaler.update(found_nonfinite=not math.isfinite(float(gnorm))):
            optimizer.zero_grad()                      # overflow: skip the step (scale was halved);
            ...                                        # not a training failure, unless not loss_ok
        else:                                          # or scaler.exhausted
            optimizer.step(); optimizer.zero_grad()

    * The reported loss is the true one: only the gradient is scaled, not the loss value.
    * A skipped step does not move Adam's step counter (so not the schedule either) and
      is not a training failure. It is one when the loss itself is non-finite (the
      forward pass overflowed or diverged: scaling cannot help) or when
      :attr:`exhausted` is set (overflow even at ``min_scale``).
    * With several processes, unscale and check after the gradients are summed, so every
      rank takes the same decision and keeps the same scale.
    * Checkpoint :meth:`state_dict` next to the optimizer's; a resumed run continues
      with the same scale.

    (Why ``scale_grad_`` multiplies the loss gradient instead of dividing the loss's
    ``normalizer`` by the scale: :class:`~numformer.loss.LabelSmoothedCrossEntropy` clamps the
    normalizer to at least 1, and would report a scaled loss.)
    """

    def __init__(self, init_scale: float = 2.0 ** 15, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 2.0 ** -14, max_scale: float = 2.0 ** 24):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("loss scaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, "
                             "growth_interval >= 1")
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)  # beyond 2**24, 1/scale nears float32's subnormals
        self.good_steps = 0       # consecutive finite steps since the last change of scale
        self.skipped_steps = 0    # overflow steps skipped in all
        self.exhausted = False    # an overflow at min_scale: not a scaling problem

    def scale_grad_(self, dloss):
        """Multiply backward's seed (dL/dlogits, (..., vocab)) by ``scale`` in place; returns it."""
        dloss *= self.scale  # a Python float: the array keeps its dtype (float32), no host sync
        return dloss

    def unscale_(self, params) -> None:
        """Divide every parameter's ``grad`` by ``scale`` in place (exact while the scale is a power of two)."""
        inv = 1.0 / self.scale
        for p in params:
            p.grad *= inv

    def update(self, found_nonfinite: bool) -> bool:
        """After unscaling and the finite check: adjust the scale; True when the step must be skipped.

        Overflow: ``scale *= backoff_factor`` (not below ``min_scale``; at it, :attr:`exhausted`
        is set), the good-step count restarts, and the step is to be skipped. Otherwise the
        good-step count grows, and every ``growth_interval`` of them ``scale *= growth_factor``
        (up to ``max_scale``).
        """
        if found_nonfinite:
            self.exhausted = self.scale <= self.min_scale
            self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return True
        self.exhausted = False
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0
        return False

    def state_dict(self) -> dict:
        """Plain Python numbers (JSON-safe, portable across devices)."""
        return {"scale": self.scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale, "max_scale": self.max_scale,
                "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        scale = float(state["scale"])
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"loss scaler state holds an invalid scale {state['scale']!r}")
        self.scale = scale
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.min_scale = float(state.get("min_scale", self.min_scale))
        self.max_scale = float(state.get("max_scale", self.max_scale))
        self.good_steps = int(state.get("good_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.exhausted = False

    def __repr__(self) -> str:
        return f"DynamicLossScaler(scale={self.scale:g}, good_steps={self.good_steps}, skipped={self.skipped_steps})"
