"""A host emulator of numformer's CUDA kernels: the CUDA C compiled as C++ by g++, its grid run on the CPU.

A test tool (only tests import it; the library never does). A GPU is lent rarely and briefly; with this, every
kernel's *logic* is tested in CI against its plain numpy twin before a GPU ever runs it:

* :func:`host_kernel` ``(name, function, source=None)`` compiles kernel ``name``'s registered source
  (``numformer/kernels/cuda_sources.py``; ``source`` in its place, how a test plants a bug) and returns its
  ``extern "C" __global__`` function ``function`` as a callable with cupy RawKernel's call form,
  ``f(grid, block, args)``: numpy arrays (C-contiguous, passed as pointers, written in place) and numpy scalars of
  exactly the C parameter's type. Where cupy would silently misread memory (an argument missing or extra, a
  scalar of another width, a strided array, an array of another dtype than the pointer's), it raises
  :class:`CudaEmulatorError` naming the parameter.
* :func:`emulated` ``(sources=None)``: while active, ``cuda_sources.kernel_function`` returns
  :func:`host_kernel`'s callables, so a kernel's Python wrapper (``numformer.kernels.adam.adam_update_cuda``)
  runs unchanged on numpy arrays.

How it runs. A small prelude (:data:`PRELUDE`) defines CUDA's names for C++: ``dim3``, ``threadIdx`` and
``blockIdx`` (thread-local), ``blockDim``, ``gridDim``; ``__global__ __device__ __host__ __forceinline__
__restrict__ __constant__ __launch_bounds__`` defined away; ``__shared__`` as ``static``; ``__syncthreads()``;
CUDA's overloads ``max``/``min`` (int, unsigned, long long, float, double) and the float overloads of ``sqrt``,
``exp``, ``log``... in the global namespace (``sqrt(float)`` returns a float, as in CUDA); the bit casts
``__float_as_int`` and kin. g++ compiles prelude + source + one generated ``extern "C"`` launcher per kernel with
``-std=c++17 -O1 -ffp-contract=off`` (no contracted multiply-add: the kernels' ``--fmad=false``) into a shared
library cached under the temp directory by SHA-256. The kernels are found in the preprocessed source (``g++ -E``),
so a kernel a macro writes (adam.py's ``ADAM_KERNEL``) is found too. The blocks run one after another (x fastest,
then y, then z); within a block, a kernel that never reaches ``__syncthreads`` runs its threads one after another;
one that does (itself or through a function of the source it calls) runs each block's threads as fibers in the
launching thread (own stacks, a guard page each), in rounds: each round resumes every thread still in the block,
in threadIdx order, from its last ``__syncthreads`` to its next one or its end, so no thread passes a barrier
before all have reached it; a thread that returned leaves the block's barriers (as on Volta and later). Fibers,
not OS threads: 256 OS threads meeting at a condition-variable barrier took 79 s for adam.py's gradient norm of
a 1M-element array on 2 cores, the fibers 0.4 s; and the order is fixed, not an OS scheduler's, so a missing
``__syncthreads`` fails at every run, not now and then. ``__shared__`` memory is one static copy that serves
each block in turn (never cleared: like the GPU's, it holds what the last block left).

The dialect (the rule ``cuda_sources.py`` states for every kernel): grid-stride loops; 1-3 dimensional grids and
blocks; ``__shared__`` arrays of fixed size; ``__syncthreads``; templates and ``__device__`` helpers; macros;
the IEEE operations + - * / and sqrt, which g++ computes exactly as the GPU and numpy do (a kernel equals its
plain twin bit for bit), and expf/logf/exp/log (within a few ulps: glibc's are not CUDA's, compare with a
tolerance). Refused at compile time, with one error naming the construct: warp shuffles and votes (``__shfl*``,
``__ballot``, ``__any_sync``...), atomics (``atomicAdd``...), ``extern __shared__`` (dynamic shared memory),
cooperative groups, and the approximate intrinsics (``__expf``, ``__logf``, ``rsqrtf``, ``__fdividef``...: they
also break equality with the plain math on the GPU). A kernel must be declared ``extern "C" __global__ void``.
A wild index crashes the process (no bounds checks), as it may on the GPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NumformerError
from . import cuda_sources

VERSION = "3"  # part of the cache key: bump when the launcher code below changes
FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread")
MAX_THREADS = 1024  # per block, as on every GPU numformer targets


class CudaEmulatorError(NumformerError):
    """The host emulator cannot compile or run a kernel as asked (the message says what and where)."""


class CudaEmulatorArgumentError(CudaEmulatorError, TypeError):
    """A launch's grid, block or arguments do not match the kernel (cupy would misread memory)."""


PRELUDE = r"""// numformer's CUDA host emulator: CUDA's names for g++ (numformer/kernels/cuda_emulator.py)
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__
#define __constant__
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;

using std::sqrt; using std::exp; using std::log; using std::exp2; using std::log2; using std::log10;
using std::expm1; using std::log1p; using std::pow; using std::fabs; using std::abs; using std::floor;
using std::ceil; using std::round; using std::trunc; using std::rint; using std::fmod; using std::tanh;
using std::sin; using std::cos; using std::tan; using std::erf; using std::fma; using std::fmax; using std::fmin;
using std::isnan; using std::isinf; using std::isfinite; using std::signbit; using std::copysign;

#define __NF_MAXMIN(A, B, R) \
    static inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; } \
    static inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }
__NF_MAXMIN(int, int, int)
__NF_MAXMIN(unsigned int, unsigned int, unsigned int)
__NF_MAXMIN(int, unsigned int, unsigned int)
__NF_MAXMIN(unsigned int, int, unsigned int)
__NF_MAXMIN(long long, long long, long long)
__NF_MAXMIN(unsigned long long, unsigned long long, unsigned long long)
__NF_MAXMIN(long long, unsigned long long, unsigned long long)
__NF_MAXMIN(unsigned long long, long long, unsigned long long)
#undef __NF_MAXMIN
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(float a, double b) { return fmax((double)a, b); }
static inline double min(float a, double b) { return fmin((double)a, b); }
static inline double max(double a, float b) { return fmax(a, (double)b); }
static inline double min(double a, float b) { return fmin(a, (double)b); }

static inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
static inline unsigned int __float_as_uint(float x) { unsigned int i; std::memcpy(&i, &x, 4); return i; }
static inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
static inline float __uint_as_float(unsigned int i) { float x; std::memcpy(&x, &i, 4); return x; }
static inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
static inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }

// The threads of a block that reaches __syncthreads: fibers (each its own stack) in the launching thread, run in
// rounds: each round resumes every thread still in the block, in threadIdx order (x fastest), from its last
// __syncthreads to its next one or to its end, so a round ends when every thread is at the barrier; a thread that
// returned leaves the block's barriers (as on Volta and later). On x86-64 a fiber switch is a few instructions
// (callee-saved registers and the stack pointer); elsewhere ucontext (which makes a system call each switch).
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
asm(R"(
    .text
    .p2align 4
    .type __nf_switch, @function
__nf_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size __nf_switch, .-__nf_switch
)");
extern "C" void __nf_switch(void** save_sp, void* load_sp);  // saves this context's stack pointer, loads another's
#else
#include <ucontext.h>
#endif
#include <sys/mman.h>

struct __nf_fibers {
    unsigned n = 0, current = 0;
    size_t stack_size = 256 * 1024, guard = 4096;
    char* stacks = nullptr;
    std::vector<unsigned char> done;
    void (*call)(void*) = nullptr;
    void* arg = nullptr;
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
    void* scheduler = nullptr;
    std::vector<void*> sp;
#else
    ucontext_t scheduler;
    std::vector<ucontext_t> contexts;
#endif
};
static __nf_fibers* __nf_active = nullptr;

static inline void __nf_yield() {
    __nf_fibers* f = __nf_active;
    asm volatile("" ::: "memory");  // other threads write shared memory meanwhile: nothing cached across a barrier
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
    __nf_switch(&f->sp[f->current], f->scheduler);
#else
    swapcontext(&f->contexts[f->current], &f->scheduler);
#endif
    asm volatile("" ::: "memory");
}

static void __nf_fiber_main() {
    __nf_fibers* f = __nf_active;
    f->call(f->arg);
    f->done[f->current] = 1;
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
    __nf_yield();
    __builtin_unreachable();
#endif  // ucontext: returning resumes uc_link, the scheduler
}

static inline void __syncthreads() {
    if (__nf_active) { __nf_yield(); return; }
    if (blockDim.x * blockDim.y * blockDim.z > 1) {
        std::fprintf(stderr, "numformer CUDA emulator: __syncthreads in a kernel run without fibers\n");
        std::abort();
    }
}

static std::mutex __nf_launch_mutex;

template <typename Body>
static void __nf_call(void* body) { (*static_cast<Body*>(body))(); }

// One launch: the blocks one after another (x fastest); a block's threads one after another (synced == false),
// or as fibers in rounds between __syncthreads. Returns 0, or 1 when the fibers' stacks could not be mapped.
template <typename Body>
static int __nf_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       bool synced, Body body) {
    std::lock_guard<std::mutex> guard(__nf_launch_mutex);
    gridDim = dim3(gx, gy, gz);
    blockDim = dim3(bx, by, bz);
    unsigned n = bx * by * bz;
    if (!synced || n == 1) {
        for (unsigned z = 0; z < gz; ++z)
            for (unsigned y = 0; y < gy; ++y)
                for (unsigned x = 0; x < gx; ++x) {
                    blockIdx = uint3{x, y, z};
                    for (unsigned tz = 0; tz < bz; ++tz)
                        for (unsigned ty = 0; ty < by; ++ty)
                            for (unsigned tx = 0; tx < bx; ++tx) {
                                threadIdx = uint3{tx, ty, tz};
                                body();
                            }
                }
        return 0;
    }
    __nf_fibers f;
    f.n = n;
    f.done.assign(n, 0);
    f.call = &__nf_call<Body>;
    f.arg = &body;
    size_t slot = f.guard + f.stack_size, total = slot * n;
    void* mapped = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) return 1;
    f.stacks = static_cast<char*>(mapped);
    for (unsigned i = 0; i < n; ++i) mprotect(f.stacks + i * slot, f.guard, PROT_NONE);  // overflow: a fault
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
    f.sp.assign(n, nullptr);
#else
    f.contexts.resize(n);
#endif
    __nf_active = &f;
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = uint3{x, y, z};
                for (unsigned i = 0; i < n; ++i) {
                    char* top = f.stacks + i * slot + slot;
                    f.done[i] = 0;
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
                    // a frame __nf_switch pops: six callee-saved registers, then the return address; after the
                    // ret the stack pointer is 8 mod 16, as at any function's entry
                    void** frame = reinterpret_cast<void**>(top - 64);
                    for (int r = 0; r < 6; ++r) frame[r] = nullptr;
                    frame[6] = reinterpret_cast<void*>(&__nf_fiber_main);
                    frame[7] = nullptr;
                    f.sp[i] = frame;
#else
                    getcontext(&f.contexts[i]);
                    f.contexts[i].uc_stack.ss_sp = f.stacks + i * slot + f.guard;
                    f.contexts[i].uc_stack.ss_size = f.stack_size;
                    f.contexts[i].uc_link = &f.scheduler;
                    makecontext(&f.contexts[i], &__nf_fiber_main, 0);
#endif
                }
                unsigned live = n;
                while (live) {
                    for (unsigned i = 0; i < n; ++i) {
                        if (f.done[i]) continue;
                        f.current = i;
                        threadIdx = uint3{i % bx, (i / bx) % by, i / (bx * by)};
#if defined(__x86_64__) && !defined(__NF_UCONTEXT)
                        __nf_switch(&f.scheduler, f.sp[i]);
#else
                        swapcontext(&f.scheduler, &f.contexts[i]);
#endif
                        if (f.done[i]) --live;
                    }
                }
            }
    __nf_active = nullptr;
    munmap(mapped, total);
    return 0;
}
"""

# Constructs the emulator cannot run as the GPU does (or that differ from the plain math): refused by name.
REFUSED = (
    (r"\b__shfl\w*", "warp shuffles"),
    (r"\b__(?:ballot|any|all|uni|match|activemask|syncwarp|reduce_\w+)(?:_sync)?\b", "warp votes and warp sync"),
    (r"\batomic[A-Z]\w*", "atomics"),
    (r"\bextern\s+__shared__", "extern __shared__ (dynamic shared memory)"),
    (r"\bcooperative_groups\b|\bthis_grid\b|\bthis_thread_block\b|\btiled_partition\b", "cooperative groups"),
    (r"\b(?:__expf|__exp10f|__logf|__log2f|__log10f|__powf|__sinf|__cosf|__tanf|__sincosf|__fdividef|__fdiv_\w+"
     r"|__frcp_\w+|__frsqrt_rn|__fsqrt_\w+|__saturatef|rsqrtf|rsqrt|rcbrtf|rcbrt|__f\w+_r[nzud])\b",
     "approximate or rounding-mode intrinsics (they differ from the plain math)"),
)

_KERNEL = re.compile(r'extern\s*"C"\s*__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
                     r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(([^)]*)\)")
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_TYPE_WORDS = {"int", "float", "double", "char", "short", "long", "unsigned", "signed", "bool", "void",
               "size_t", "ptrdiff_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
               "uint32_t", "uint64_t", *_QUALIFIERS}
# C type (qualifiers dropped, words in order) -> numpy dtype
_DTYPES = {
    "float": np.float32, "double": np.float64, "bool": np.bool_,
    "char": np.int8, "signed char": np.int8, "int8_t": np.int8, "unsigned char": np.uint8, "uint8_t": np.uint8,
    "short": np.int16, "short int": np.int16, "signed short": np.int16, "int16_t": np.int16,
    "unsigned short": np.uint16, "unsigned short int": np.uint16, "uint16_t": np.uint16,
    "int": np.int32, "signed": np.int32, "signed int": np.int32, "int32_t": np.int32,
    "unsigned": np.uint32, "unsigned int": np.uint32, "uint32_t": np.uint32,
    "long": np.int64, "long int": np.int64, "long long": np.int64, "long long int": np.int64,
    "signed long long": np.int64, "int64_t": np.int64, "ptrdiff_t": np.int64,
    "unsigned long": np.uint64, "unsigned long int": np.uint64, "unsigned long long": np.uint64,
    "unsigned long long int": np.uint64, "uint64_t": np.uint64, "size_t": np.uint64,
}
_CTYPES = {np.float32: ctypes.c_float, np.float64: ctypes.c_double, np.bool_: ctypes.c_bool,
           np.int8: ctypes.c_int8, np.uint8: ctypes.c_uint8, np.int16: ctypes.c_int16, np.uint16: ctypes.c_uint16,
           np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64,
           np.uint64: ctypes.c_uint64}
# cupy passes a Python scalar as numpy's default type of its kind
_PYTHON_SCALARS = {bool: np.bool_, int: np.int64, float: np.float64}


@dataclass(frozen=True)
class Parameter:
    """One kernel parameter: its C type as written (after the preprocessor), its name, and what it takes."""
    c_type: str
    name: str
    pointer: bool
    dtype: type | None  # the scalar's (or the pointed-to element's) numpy type; None: a pointer to anything
    const: bool


def _parameter(text: str, index: int) -> Parameter:
    text = " ".join(text.split("=")[0].split())  # default arguments dropped, whitespace normalised
    array = "[" in text
    if array:
        text = text[:text.index("[")].strip()
    match = re.search(r"([A-Za-z_]\w*)\s*$", text)
    name = match.group(1) if match else ""
    c_type = text[:match.start()].strip() if match else text
    if not match or name in _TYPE_WORDS or not c_type.replace("*", "").split():
        name, c_type = f"arg{index}", text  # unnamed
    if array:
        c_type += "*"
    pointer = "*" in c_type
    words = [w for w in c_type.replace("*", " ").split() if w not in _QUALIFIERS]
    base = " ".join(words)
    const = "const" in c_type.split("*")[0].split()
    dtype = _DTYPES.get(base)
    if not pointer and dtype is None:
        raise CudaEmulatorError(f"parameter {index} ({text!r}) has a type the emulator cannot pass: scalars are "
                                f"{sorted(_DTYPES)}, or pointers")
    return Parameter(c_type, name, pointer, dtype, const)


@dataclass(frozen=True)
class _Module:
    library: ctypes.CDLL
    kernels: dict  # function name -> tuple of Parameter
    synced: set  # the kernels that reach __syncthreads (their threads run as fibers)


def _compiler() -> str:
    gxx = shutil.which("g++")
    if gxx is None:
        raise CudaEmulatorError("the CUDA host emulator needs g++ (a C++17 compiler) on PATH, and there is none: "
                                "install it (Debian/Ubuntu: apt-get install g++)")
    return gxx


def cache_dir() -> Path:
    """Where compiled kernels are kept, by SHA-256 of what g++ compiles: a folder of the temp directory (a test
    tool's scratch; numformer's own variables are environment.py's, and this needs none)."""
    path = Path(tempfile.gettempdir()) / f"numformer-cuda-emulator-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _strip_comments(source: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)


def preprocess(source: str, label: str = "kernel") -> str:
    """``source`` through g++'s preprocessor alone (macros expanded, comments gone), as the kernels are found."""
    result = subprocess.run([_compiler(), "-E", "-P", "-x", "c++", "-std=c++17", "-"], input=source,
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise CudaEmulatorError(f"kernel {label}: g++'s preprocessor refused the source: {result.stderr.strip()}")
    return result.stdout


def refused_constructs(source: str) -> list:
    """[(what, the text found)] of the constructs the emulator refuses, in ``source`` (comments ignored)."""
    text = _strip_comments(source)
    found = []
    for pattern, what in REFUSED:
        match = re.search(pattern, text)
        if match:
            found.append((what, match.group(0)))
    return found


def kernel_signatures(preprocessed: str, label: str = "kernel") -> dict:
    """{function name: tuple of Parameter} of every ``extern "C" __global__ void`` kernel in a preprocessed
    source."""
    kernels = {}
    for match in _KERNEL.finditer(preprocessed):
        params = match.group(2).strip()
        items = [] if params in ("", "void") else params.split(",")
        kernels[match.group(1)] = tuple(_parameter(p, i) for i, p in enumerate(items))
    if not kernels:
        raise CudaEmulatorError(f'kernel {label}: no extern "C" __global__ void function in its source')
    return kernels


def _function_bodies(text: str) -> list:
    """[(name or None, body)] of every top-level braced block of a preprocessed source (a function's name: the
    identifier before its parameter list; None for a struct, a namespace, an initializer)."""
    blocks, depth, header_start, body_start = [], 0, 0, 0
    for i, char in enumerate(text):
        if char == "{":
            if depth == 0:
                body_start = i
                header = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", text[header_start:i])
                name = re.search(r"([A-Za-z_]\w*)\s*$", header[:header.find("(")]) if "(" in header else None
                blocks.append([name.group(1) if name else None, None])
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                blocks[-1][1] = text[body_start:i + 1]
                header_start = i + 1
        elif char == ";" and depth == 0:
            header_start = i + 1
    return [(name, body or "") for name, body in blocks]


def syncing_kernels(preprocessed: str, kernels) -> set:
    """The kernels that reach ``__syncthreads`` (themselves or through the source's functions they call): these
    run their blocks' threads as fibers, the others thread after thread. Where a ``__syncthreads`` sits outside any
    function found (a struct's method), every kernel counts as syncing."""
    bodies: dict = {}
    for name, body in _function_bodies(preprocessed):
        if name is None:
            if re.search(r"\b__syncthreads\b", body):
                return set(kernels)
            continue
        bodies[name] = bodies.get(name, "") + body
    syncing = {name for name, body in bodies.items() if re.search(r"\b__syncthreads\b", body)}
    calls = {name: set(re.findall(r"[A-Za-z_]\w*", body)) for name, body in bodies.items()}
    grew = True
    while grew:
        grew = False
        for name, called in calls.items():
            if name not in syncing and called & syncing:
                syncing.add(name)
                grew = True
    return {k for k in kernels if k in syncing}


def _launchers(kernels: dict, synced: set) -> str:
    lines = ['#line 1 "<numformer CUDA emulator launchers>"']
    for function, params in kernels.items():
        decl = ", ".join(["unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz"]
                         + [f"{p.c_type} __nf_a{i}" for i, p in enumerate(params)])
        call = ", ".join(f"__nf_a{i}" for i in range(len(params)))
        lines.append(f'extern "C" int __nf_launch_{function}({decl}) {{\n'
                     f"    return __nf_launch(gx, gy, gz, bx, by, bz, {'true' if function in synced else 'false'}, "
                     f"[&] {{ {function}({call}); }});\n}}")
    return "\n".join(lines) + "\n"


_MODULES: dict = {}  # source -> _Module (this process)
_LOCK = threading.Lock()


def _module(source: str, label: str) -> _Module:
    with _LOCK:
        module = _MODULES.get(source)
        if module is None:
            module = _MODULES[source] = _build(source, label)
        return module


def _build(source: str, label: str) -> _Module:
    gxx = _compiler()
    preprocessed = preprocess(source, label)
    refused = refused_constructs(preprocessed)
    if refused:
        listed = "; ".join(f"{what} ({text})" for what, text in refused)
        raise CudaEmulatorError(f"kernel {label} uses what the CUDA host emulator does not run: {listed}. The "
                                f"dialect: numformer/kernels/cuda_emulator.py")
    kernels = kernel_signatures(preprocessed, label)
    synced = syncing_kernels(preprocessed, kernels)
    code = f'{PRELUDE}\n#line 1 "{label}.cu"\n{source}\n{_launchers(kernels, synced)}'
    key = hashlib.sha256("\0".join([VERSION, *FLAGS, code]).encode("utf-8")).hexdigest()
    folder = cache_dir()
    library = folder / f"{key}.so"
    if not library.exists():
        # this process's own file names until done (two test workers may compile the same source at once)
        mine = f"{key}.{os.getpid()}.{threading.get_ident()}"
        cpp, partial = folder / f"{mine}.cpp", folder / f"{mine}.so.tmp"
        cpp.write_text(code, encoding="utf-8")
        result = subprocess.run([gxx, *FLAGS, "-o", str(partial), "-x", "c++", str(cpp)],
                                capture_output=True, text=True, check=False)
        if result.returncode:
            cpp.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
            raise CudaEmulatorError(f"kernel {label} does not compile as C++ for the host emulator (g++ "
                                    f"{' '.join(FLAGS)}): {result.stderr.strip()}")
        os.replace(cpp, folder / f"{key}.cpp")  # kept beside the library: what a crash's debugger shows
        os.replace(partial, library)
    lib = ctypes.CDLL(str(library))
    for function, params in kernels.items():
        launcher = getattr(lib, f"__nf_launch_{function}")
        launcher.restype = ctypes.c_int
        launcher.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p if p.pointer else _CTYPES[p.dtype]
                                                   for p in params]
    return _Module(lib, kernels, synced)


def _dims(value, what: str, function: str) -> tuple:
    if isinstance(value, (int, np.integer)):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3 or \
            not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in value):
        raise CudaEmulatorArgumentError(f"kernel {function}: {what} must be a tuple of 1 to 3 positive ints, "
                                        f"got {value!r}")
    return tuple(int(v) for v in value) + (1,) * (3 - len(value))


# Called as LAUNCH_OBSERVER(name, function, run, written) for each launch in place of run() (which launches it;
# written: the arrays of its non-const pointer parameters): the tests' cupy stand-in counts launches and records
# them for a captured graph's replay (tests/cupy_standin.py).
LAUNCH_OBSERVER = None


class HostKernel:
    """One emulated kernel function, called as cupy's RawKernel is: ``kernel(grid, block, args)``."""

    def __init__(self, name: str, function: str, module: _Module):
        if function not in module.kernels:
            raise CudaEmulatorError(f"kernel {name} has no function {function!r}: it has "
                                    f"{', '.join(sorted(module.kernels))}")
        self.name, self.function, self._module = name, function, module
        self.parameters = module.kernels[function]
        self.synced = function in module.synced  # it reaches __syncthreads: its blocks' threads run as fibers
        self._launch = getattr(module.library, f"__nf_launch_{function}")

    def __repr__(self) -> str:
        params = ", ".join(f"{p.c_type} {p.name}" for p in self.parameters)
        return f"<HostKernel {self.name}:{self.function}({params})>"

    def __call__(self, grid, block, args, shared_mem: int = 0, stream=None):
        where = f"{self.name}:{self.function}"
        grid, block = _dims(grid, "grid", where), _dims(block, "block", where)
        if block[0] * block[1] * block[2] > MAX_THREADS or block[2] > 64:
            raise CudaEmulatorArgumentError(f"kernel {where}: block {block} has more than {MAX_THREADS} threads "
                                            f"(or z over 64): no GPU launches it")
        if grid[0] >= 1 << 31 or grid[1] > 65535 or grid[2] > 65535:
            raise CudaEmulatorArgumentError(f"kernel {where}: grid {grid} is beyond CUDA's limits")
        if shared_mem:
            raise CudaEmulatorArgumentError(f"kernel {where}: dynamic shared memory (shared_mem={shared_mem}) is "
                                            f"not in the emulator's dialect")
        if not isinstance(args, (tuple, list)):
            raise CudaEmulatorArgumentError(f"kernel {where}: args must be a tuple, got {type(args).__name__}")
        if len(args) != len(self.parameters):
            listed = ", ".join(f"{p.c_type} {p.name}" for p in self.parameters)
            raise CudaEmulatorArgumentError(f"kernel {where} takes {len(self.parameters)} arguments ({listed}), "
                                            f"got {len(args)}")
        values = [self._argument(p, a, i, where) for i, (p, a) in enumerate(zip(self.parameters, args))]

        def run():
            if self._launch(*grid, *block, *values):
                raise CudaEmulatorError(f"kernel {where}: could not map {block[0] * block[1] * block[2]} fiber "
                                        "stacks")
        if LAUNCH_OBSERVER is None:
            run()
        else:
            LAUNCH_OBSERVER(self.name, self.function, run,
                            [a for p, a in zip(self.parameters, args) if p.pointer and not p.const])

    @staticmethod
    def _argument(p: Parameter, value, index: int, where: str):
        said = f"kernel {where}: argument {index} ({p.c_type} {p.name})"
        if p.pointer:
            if not isinstance(value, np.ndarray):
                raise CudaEmulatorArgumentError(f"{said} takes a numpy array, got {type(value).__name__}")
            if not value.flags.c_contiguous:
                raise CudaEmulatorArgumentError(f"{said}: the array is not C-contiguous (a kernel reads it as one "
                                                f"flat buffer; pass np.ascontiguousarray)")
            if p.dtype is not None and value.dtype != np.dtype(p.dtype):
                raise CudaEmulatorArgumentError(f"{said} points to {np.dtype(p.dtype).name}, the array is "
                                                f"{value.dtype}")
            if not p.const and not value.flags.writeable:
                raise CudaEmulatorArgumentError(f"{said}: the kernel may write it and the array is read-only")
            return np.ndarray.view(value, np.ndarray).ctypes.data  # a numpy subclass (the tests' cupy stand-in) too
        if isinstance(value, np.ndarray):
            raise CudaEmulatorArgumentError(f"{said} takes a scalar (np.{np.dtype(p.dtype).name}), got an array "
                                            f"(cupy would pass its pointer)")
        dtype = _PYTHON_SCALARS.get(type(value))
        if dtype is None:
            if not isinstance(value, np.generic):
                raise CudaEmulatorArgumentError(f"{said} takes np.{np.dtype(p.dtype).name}, got "
                                                f"{type(value).__name__}")
            dtype = value.dtype.type
        if np.dtype(dtype) != np.dtype(p.dtype):
            got = np.dtype(dtype).name
            if type(value) in _PYTHON_SCALARS:
                got = f"a Python {type(value).__name__}, which cupy passes as {got}"
            raise CudaEmulatorArgumentError(f"{said} takes np.{np.dtype(p.dtype).name}, got {got} (cupy would pass "
                                            f"its {np.dtype(dtype).itemsize} bytes, read as the C type)")
        return dtype(value).item() if dtype is not np.bool_ else bool(value)


def host_kernel(name: str, function: str, source: str | None = None) -> HostKernel:
    """Function ``function`` of kernel ``name`` (its registered source, or ``source``), compiled for the host:
    call it as cupy's RawKernel, ``f(grid, block, args)``, with numpy arrays and numpy scalars."""
    if source is None:
        if name not in cuda_sources.SOURCES:
            raise CudaEmulatorError(f"no kernel {name!r} is registered: {', '.join(sorted(cuda_sources.SOURCES))}")
        source = cuda_sources.SOURCES[name]
    return HostKernel(name, function, _module(source, name))


@contextlib.contextmanager
def emulated(sources: dict | None = None):
    """While active, ``cuda_sources.kernel_function(name, function)`` returns ``host_kernel(name, function)``
    (with ``sources[name]`` in place of the registered source where given), so a kernel's Python wrapper runs
    on numpy arrays."""
    sources = dict(sources or {})
    previous = cuda_sources.KERNEL_FUNCTION_HOOK

    def hook(name: str, function: str):
        return host_kernel(name, function, sources.get(name))

    cuda_sources.KERNEL_FUNCTION_HOOK = hook
    try:
        yield
    finally:
        cuda_sources.KERNEL_FUNCTION_HOOK = previous
