"""GEMMs a CUDA graph can capture: a cuBLAS handle of numformer's own, bound to the capture stream before it begins.

Why CuPy's own GEMMs cannot be captured. Every cuBLAS wrapper of CuPy (``gemmEx``, ``gemmStridedBatchedEx``,
``sgemm``...) first calls ``setStream(handle, current stream)``, and ``setStream`` raises
``NotImplementedError('calling cuBLAS API during stream capture is currently unsupported')`` when that stream is
capturing (cupy/cupy, ``cupy_backends/cuda/libs/cublas.pyx``, ``setStream``); CuPy's own test asserts that
``cupy.matmul`` raises under capture (``tests/cupy_tests/cuda_tests/test_graph.py``,
``test_stream_capture_failure_cublas``). So ``a @ b`` on cupy arrays inside ``Stream.begin_capture`` fails, and
with it the capture of any training step. cuBLAS itself can be captured (NVIDIA's cuBLAS guide, "CUDA Graphs
Support") once the handle works in a workspace the caller gave it (``cublasSetWorkspace``), so that no call
allocates while the stream captures.

What this module does instead (issue 66, item 1):

* :class:`Handle` is a cuBLAS handle numformer creates (``cublasCreate_v2``) with a workspace array of its own
  (:data:`WORKSPACE_BYTES`, allocated once, outside any capture). :meth:`Handle.bind` sets its stream
  (``cublasSetStream_v2``) and then its workspace (``cublasSetWorkspace_v2``: setting the stream puts the
  workspace back to cuBLAS's default one, the cuBLAS guide says), and is called before a capture begins, never
  inside one; the GEMM calls then check nothing about streams.
* :meth:`Handle.matmul` is ``a @ b`` for 2-D operands (``cublasGemmEx``) and for batches of matrices with any
  number of batch axes that broadcast (``cublasGemmStridedBatchedEx``): NumPy's row-major operands are handed to
  column-major cuBLAS as their transposes (``C^T = B^T A^T``), a transposed view (``w.T``, ``k.swapaxes(-1, -2)``)
  as a transpose flag, never copied; a batch whose strides are one stride per operand (a contiguous stack, a
  broadcast weight) needs no copy either; an operand that is neither (the head views of multi-head attention:
  two batch strides) is copied to a contiguous array first, as CuPy's ``matmul`` does
  (``cupy/_core/_routines_linalg.pyx``). float32 (``CUBLAS_COMPUTE_32F``, or ``..._FAST_TF32`` with
  ``tf32=True``), float64 (``..._64F``) and float16 operands (float32 accumulation, a float16 result: what CuPy's
  fp16 matmul computes). The result is a new C-contiguous array.
* :func:`owned_gemms` installs a handle as the device GEMM of :func:`numformer.backend.product` (and so of
  :func:`numformer.backend.matmul` and the attention kernels' batched products) for a block: the body of a
  captured training step (numformer/training/step_graphs.py). Outside it, and for host arrays, ``@`` runs.

**The bindings: ctypes, on the libcublas CuPy loaded** (:class:`CublasLibrary`), chosen over NVIDIA's
``nvmath-python`` (``nvmath.bindings.cublas``: ``create``, ``set_stream``, ``set_workspace``, ``gemm_ex``,
``gemm_strided_batched_ex``, thin wrappers that do not re-check the stream either; pip has nvmath-python 1.0.0).
Why: the GPU machines' image has no nvmath-python (it would have to travel with every GPU call, 22 MB unpacked,
and it needs cuda-core and cuda-pathfinder of versions this project cannot check without a GPU), while ctypes is
Python's own and libcublas is already in the process, found where CuPy found it (cuda-pathfinder's
``load_nvidia_dynamic_lib("cublas")``, which CuPy 14 calls: ``cupy_backends/cuda/libs/__init__.py``): the same
library, the same GEMM kernels as CuPy's ``@``. :class:`CublasLibrary`'s methods have nvmath's names and
argument order, so ``Handle(nvmath.bindings.cublas, cupy)`` works in its place. The calls and their argument
arithmetic are tested without a GPU: the CuPy stand-in of the tests (tests/cupy_standin.py) answers these same
calls on host memory, column-major, as cuBLAS defines them, and refuses a call from a handle that is not bound to
the capturing stream or has no workspace of its own.
"""
from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from .. import backend
from ..errors import NumformerError

# cuBLAS's and CUDA's constants (cublas_api.h, library_types.h)
OP_N, OP_T = 0, 1
CUDA_R_32F, CUDA_R_64F, CUDA_R_16F = 0, 1, 2
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20  # what the cuBLAS guide recommends for Hopper (4 MiB is enough before it)
_DATA_TYPES = {"float32": CUDA_R_32F, "float64": CUDA_R_64F, "float16": CUDA_R_16F}


class CublasError(NumformerError, RuntimeError):
    """A cuBLAS call returned an error status (a bug of numformer's, or a device fault); the message names it."""


class CublasLibrary:
    """ctypes bindings of the few cuBLAS functions numformer calls, with nvmath-python's names and argument order
    (pointers and handles as ints). ``path``: the libcublas shared library (None: the one CuPy loaded)."""

    def __init__(self, path: str | None = None):
        if path is None:
            from cuda import pathfinder  # noqa: PLC0415  (on a GPU only: what CuPy 14 loads cuBLAS through)

            path = pathfinder.load_nvidia_dynamic_lib("cublas").abs_path
        lib = ctypes.CDLL(path)
        p, i, ll, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
        self._functions = {}
        for name, args in (
                ("cublasCreate_v2", [ctypes.POINTER(p)]),
                ("cublasDestroy_v2", [p]),
                ("cublasSetStream_v2", [p, p]),
                ("cublasSetWorkspace_v2", [p, p, size]),
                ("cublasGemmEx", [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]),
                ("cublasGemmStridedBatchedEx", [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i,
                                                i])):
            function = getattr(lib, name)
            function.argtypes, function.restype = args, ctypes.c_int
            self._functions[name] = function

    def _call(self, name: str, *args) -> None:
        status = self._functions[name](*args)
        if status:
            raise CublasError(f"{name} returned cuBLAS status {status} (a bug of numformer's, or a device fault)")

    def create(self) -> int:
        handle = ctypes.c_void_p()
        self._call("cublasCreate_v2", ctypes.byref(handle))
        return int(handle.value)

    def destroy(self, handle: int) -> None:
        self._call("cublasDestroy_v2", handle)

    def set_stream(self, handle: int, stream: int) -> None:
        self._call("cublasSetStream_v2", handle, stream)

    def set_workspace(self, handle: int, workspace: int, nbytes: int) -> None:
        self._call("cublasSetWorkspace_v2", handle, workspace, nbytes)

    def gemm_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc,
                compute_type, algo) -> None:
        self._call("cublasGemmEx", handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c,
                   ctype, ldc, compute_type, algo)

    def gemm_strided_batched_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, stride_a, b, btype,
                                ldb, stride_b, beta, c, ctype, ldc, stride_c, batch_count, compute_type,
                                algo) -> None:
        self._call("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, a, atype, lda, stride_a,
                   b, btype, ldb, stride_b, beta, c, ctype, ldc, stride_c, batch_count, compute_type, algo)


# Which library a Handle calls: a function of the array module (the tests' stand-in puts its own here).
LIBRARY_FACTORY = lambda xp: CublasLibrary()  # noqa: E731


def pointer(a) -> int:
    """The address of ``a``'s first element: cupy's device pointer, or (the stand-in's numpy arrays) the host one."""
    data = a.data
    ptr = getattr(data, "ptr", None)
    return ptr if ptr is not None else a.__array_interface__["data"][0]


def _matrix(a):
    """How cuBLAS reads the 2-D (last two axes) view ``a`` (rows r, cols c) -> (op, ld) for ``a`` given as cuBLAS's
    *second-from-the-right* factor of ``C^T = B^T A^T``: a row-major view (unit column stride) is its transpose
    column-major, op N with ld its row stride; a column-major view (a transposed one) is op T with ld its column
    stride; None when neither (a copy is needed)."""
    r, c = a.shape[-2:]
    s0, s1 = (s // a.itemsize for s in a.strides[-2:])
    if (s1 == 1 or c == 1) and (s0 >= max(1, c) or r == 1):
        return OP_N, max(s0 if r > 1 else c, 1)
    if (s0 == 1 or r == 1) and (s1 >= max(1, r) or c == 1):
        return OP_T, max(s1 if c > 1 else r, 1)
    return None


def _batch_stride(a, batch_shape):
    """One stride (elements) that walks ``a``'s batch axes, broadcast to ``batch_shape``, in C order; None if two
    strides are needed (a copy is)."""
    lead = a.ndim - 2
    dims = (1,) * (len(batch_shape) - lead) + tuple(a.shape[:lead])
    strides = (0,) * (len(batch_shape) - lead) + tuple(s // a.itemsize for s in a.strides[:lead])
    stride = None  # the innermost non-trivial axis's stride; every outer one must be it times the inner extent
    extent = 1
    for d, n, s in zip(reversed(dims), reversed(batch_shape), reversed(strides)):
        if n == 1:
            continue
        s = 0 if d == 1 else s
        if stride is None:
            stride, extent = s, n
        elif s != stride * extent:
            return None
        else:
            extent *= n
    return 0 if stride is None else stride


class Handle:
    """A cuBLAS handle of numformer's own with a workspace of its own, on the device of array module ``xp``.

    ``library``: what answers the cuBLAS calls (:class:`CublasLibrary`, ``nvmath.bindings.cublas``, or the tests'
    stand-in); None: :data:`LIBRARY_FACTORY`'s. :meth:`bind` it to the stream its GEMMs go to, before a capture
    of that stream begins."""

    def __init__(self, xp, library=None):
        self.xp = xp
        self.library = LIBRARY_FACTORY(xp) if library is None else library
        self.handle = self.library.create()
        self.workspace = xp.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self.stream = None  # the stream bound last (a stream pointer)
        self._one = {t: np.array(1, dtype=t) for t in (np.float32, np.float64)}
        self._zero = {t: np.array(0, dtype=t) for t in (np.float32, np.float64)}

    def bind(self, stream: int) -> None:
        """Send this handle's GEMMs to ``stream`` (a stream pointer), in this handle's own workspace."""
        self.library.set_stream(self.handle, int(stream))
        self.library.set_workspace(self.handle, pointer(self.workspace), WORKSPACE_BYTES)
        self.stream = int(stream)

    def close(self) -> None:
        if self.handle:
            self.library.destroy(self.handle)
            self.handle = 0

    def _types(self, a, tf32: bool):
        """(cuda data type of operands and result, compute type, alpha/beta dtype)."""
        name = a.dtype.name
        if name == "float64":
            return CUDA_R_64F, COMPUTE_64F, np.float64
        if name == "float16":
            return CUDA_R_16F, COMPUTE_32F, np.float32
        return CUDA_R_32F, (COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F), np.float32

    def matmul(self, a, b, tf32: bool = False):
        """``a @ b`` on this handle: (..., m, k) @ (..., k, n) -> a new C-contiguous (..., m, n), batch axes
        broadcast; float16, float32 or float64, both operands of one dtype."""
        xp = self.xp
        if a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype.name not in _DATA_TYPES:
            raise CublasError(f"numformer's cuBLAS GEMM takes two arrays of two or more axes and one float dtype, "
                              f"got {a.shape} {a.dtype} and {b.shape} {b.dtype} (a bug of numformer's)")
        m, k = a.shape[-2:]
        k2, n = b.shape[-2:]
        if k != k2:
            raise ValueError(f"matmul: {a.shape} @ {b.shape}: the inner dimensions differ")
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        if _matrix(a) is None or (batch and _batch_stride(a, batch) is None):
            a = xp.ascontiguousarray(a)
        if _matrix(b) is None or (batch and _batch_stride(b, batch) is None):
            b = xp.ascontiguousarray(b)
        c = xp.empty(batch + (m, n), dtype=a.dtype)
        if c.size == 0:
            return c
        if k == 0:
            c[...] = 0
            return c
        dtype, compute, scalar = self._types(a, tf32)
        one, zero = self._one[scalar], self._zero[scalar]
        (op_b, ld_b), (op_a, ld_a) = _matrix(b), _matrix(a)
        # C^T (n x m, column-major, ld n) = op(B as stored) op(A as stored): cuBLAS's m, n, k are n, m, k here
        args = (self.handle, op_b, op_a, n, m, k, one.ctypes.data)
        if not batch:
            self.library.gemm_ex(*args, pointer(b), dtype, ld_b, pointer(a), dtype, ld_a, zero.ctypes.data,
                                 pointer(c), dtype, n, compute, GEMM_DEFAULT)
        else:
            count = int(np.prod(batch))
            self.library.gemm_strided_batched_ex(
                *args, pointer(b), dtype, ld_b, _batch_stride(b, batch), pointer(a), dtype, ld_a,
                _batch_stride(a, batch), zero.ctypes.data, pointer(c), dtype, n, m * n, count, compute,
                GEMM_DEFAULT)
        return c


@contextlib.contextmanager
def owned_gemms(handle: Handle, tf32: bool = False):
    """Inside: :func:`numformer.backend.product` (and so ``backend.matmul`` and the attention kernels' batched
    products) computes device products on ``handle`` (bound beforehand: :meth:`Handle.bind`); ``tf32``: float32
    products in TF32 (``--precision tf32``: every float32 GEMM of the step, the batched ones too)."""
    def product(a, b):
        return handle.matmul(a, b, tf32=tf32)

    previous = backend.set_device_gemm(product)
    try:
        yield handle
    finally:
        backend.set_device_gemm(previous)
