"""The CUDA C sources of numformer's GPU kernels: compiled by NVRTC, trusted only once a GPU has proven them.

A GPU kernel is CUDA C in a string beside its host twin (``numformer/kernels/adam.py``'s fused Adam), registered
here by name (:func:`cuda_source`). Two things keep a GPU's rare minutes for what only a GPU can tell:

* **Compiled without a GPU.** NVRTC, the CUDA runtime compiler, is a pip package (``nvidia-cuda-nvrtc-cu12``,
  installed by ``.ci/setup``) that turns CUDA C into PTX on a machine with no GPU and no driver;
  :func:`compile_ptx` does so with the options the kernel runs with, and ``tests/kernels/test_cuda_sources.py``
  compiles every source in CI, so a typo fails there, with the compiler's log, not on the GPU.
* **Proved on a GPU before it is trusted.** A kernel runs by default only when ``cuda_proofs.json`` (committed,
  beside this file) records a GPU run that passed its tests at the source's current SHA-256 (with the date and
  the GPU). Until then the switch runs the plain math, and ``NUMFORMER_CUDA_UNPROVEN=1`` opts in (what the GPU
  test run does to prove it). A changed source is unproven again: its hash no longer matches.

Every kernel is compiled with ``--fmad=false``: the plain math runs one cupy kernel per array operation, each
rounding its result, and a contracted multiply-add would round once where the plain math rounds twice; without
contraction a fused kernel computes the plain math's floats, bit for bit.

**The dialect: tested on the host before a GPU.** Every kernel is written so that
``numformer/kernels/cuda_emulator.py`` can compile it as C++ (g++) and run its grid on the CPU, where CI tests it
against its plain twin: ``extern "C" __global__ void`` functions; grid-stride loops; 1-3 dimensional grids and
blocks; ``__shared__`` arrays of fixed size and ``__syncthreads``; templates, ``__device__`` helpers, macros; the
IEEE operations + - * / and sqrt (bit for bit the plain math's) and expf/logf/exp/log (within a few ulps). Not in
it, and refused by the emulator with one clear error: warp shuffles and votes (``__shfl*``), atomics,
``extern __shared__`` (dynamic shared memory), cooperative groups, and approximate intrinsics (``__expf``,
``__logf``, ``rsqrtf``, ``__fdividef``, which also break equality with the plain math on the GPU).
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from .. import environment
from ..errors import NumformerError

SOURCES: dict = {}  # name -> CUDA C source
OPTIONS = ("--fmad=false", "-std=c++14")
PROOFS = Path(__file__).with_name("cuda_proofs.json")
ARCHITECTURES = ("compute_80", "compute_90")  # A100, H100/H200: what CI compiles every source for


class CudaCompileError(NumformerError):
    """NVRTC refused a kernel source; the message holds the compiler's log (a bug of numformer's)."""


def cuda_source(name: str, source: str) -> str:
    """Register ``source`` as the CUDA C of kernel ``name``; returns it."""
    SOURCES[name] = source
    return source


def source_hash(name: str) -> str:
    """The SHA-256 of kernel ``name``'s current source (what a proof records)."""
    return _sha256(SOURCES[name])


@functools.lru_cache(maxsize=64)
def _sha256(source: str) -> str:
    # The switch asks whether a kernel is proven at every call on a GPU (dozens a step): a source is hashed once,
    # keyed by its text (a test's planted source is another text, hashed anew)
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def proofs() -> dict:
    """{kernel name: {"sha256", "date", "gpu", "commit"}}: the GPU runs that passed, as committed (read once per
    version of the file: the switch asks at every step)."""
    try:
        stamp = PROOFS.stat().st_mtime_ns
    except FileNotFoundError:
        return {}
    return _read_proofs(str(PROOFS), stamp)


@functools.lru_cache(maxsize=4)
def _read_proofs(path: str, stamp: int) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def proven(name: str) -> bool:
    """Whether a GPU run passed kernel ``name``'s tests at its current source."""
    return proofs().get(name, {}).get("sha256") == source_hash(name)


def may_run(name: str) -> bool:
    """Whether the switch may run kernel ``name`` on a GPU: proven, or opted in (NUMFORMER_CUDA_UNPROVEN=1)."""
    return proven(name) or environment.cuda_unproven()


def compile_ptx(name: str, architecture: str = "compute_90", source: str | None = None) -> str:
    """Kernel ``name``'s PTX for ``architecture``, compiled by NVRTC with :data:`OPTIONS` (no GPU needed);
    ``source`` in place of the registered one (a test's planted error). Raises CudaCompileError with the log."""
    from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415  (cupy only when asked for)

    program = nvrtc.createProgram(SOURCES[name] if source is None else source, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={architecture}", *OPTIONS])
    except nvrtc.NVRTCError as exc:
        raise CudaCompileError(f"kernel {name} does not compile for {architecture} (a bug of numformer's): "
                               f"{nvrtc.getProgramLog(program).strip()}") from exc
    ptx = nvrtc.getPTX(program)
    return ptx.decode("utf-8").rstrip("\x00") if isinstance(ptx, bytes) else ptx


_MODULES: dict = {}
# (name, function) -> a callable in its place; set by numformer.kernels.cuda_emulator.emulated() (tests only)
KERNEL_FUNCTION_HOOK = None


def kernel_function(name: str, function: str):
    """The compiled ``function`` of kernel ``name`` on the current GPU (cupy.RawModule, compiled once); under
    ``cuda_emulator.emulated()``, its host emulation instead."""
    if KERNEL_FUNCTION_HOOK is not None:
        return KERNEL_FUNCTION_HOOK(name, function)
    module = _MODULES.get(name)
    if module is None:
        import cupy  # noqa: PLC0415

        module = _MODULES[name] = cupy.RawModule(code=SOURCES[name], options=OPTIONS)
    return module.get_function(function)
