"""Every environment variable numformer reads or sets, in one place.

A setting that comes from the shell is read here and nowhere else, so one page lists them all:

==========================  ==========================================================================
``NUMFORMER_KERNELS``       ``fast`` (default) or ``plain``: the whole model on the plain math
                            (:mod:`numformer.kernels`); ``plain`` also skips the host tunings
``NUMFORMER_KERNELS_OFF``   kernel files left out, comma-separated (``attention,loss``)
``NUMFORMER_NUM_THREADS``   host threads for elementwise kernels (else ``OMP_NUM_THREADS``, else the cores)
``NUMFORMER_BLAS_TUNE``     ``0``: leave ``OPENBLAS_THREAD_TIMEOUT`` alone (:mod:`numformer.kernels.host.blas_threads`)
``NUMFORMER_MALLOC_TUNE``   ``0``: leave glibc's allocator alone (:mod:`numformer.kernels.host.allocator`)
``NUMFORMER_DEVICE``        the device when no ``--device`` is given (``cpu``, ``cuda``, ``cuda:N``)
``NUMFORMER_DEBUG``         ``1``: a user error or a bug shows its traceback instead of one line
``NUMFORMER_CUDA_UNPROVEN`` ``1``: run the CUDA kernels no GPU run has proven at their current source yet
                            (:mod:`numformer.kernels.cuda_sources`); default: the plain math for those
``NUMFORMER_CACHE``         where built corpora are cached (else ``$XDG_CACHE_HOME/numformer``, else ``~/.cache/numformer``)
``SWORD_PATH``              where the SWORD Bible modules are, before the system folders
MPI launcher variables      ``OMPI_COMM_WORLD_SIZE``/``PMI_SIZE``, ``OMPI_COMM_WORLD_RANK``/``PMIX_RANK``/``PMI_RANK``
==========================  ==========================================================================

Two variables are *set* for other libraries, also only here: ``OPENBLAS_THREAD_TIMEOUT`` (before numpy
loads, :func:`set_blas_thread_timeout`) and ``CUPY_TF32`` (the tf32 matmul mode, :func:`set_cupy_tf32`).
Nothing here imports numpy: the BLAS setting must be made before numpy loads.

A value numformer cannot use is refused, never ignored: every reader below raises
:class:`EnvironmentVariableError` (one line naming the variable, its value and the values it takes) at
first use, and every command checks them all when it starts (:func:`check_all`, called by the front,
numformer/cli/front.py), before any work. Nothing is read at import: importing numformer never fails
for a bad variable.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import NumformerError

LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


# The kernel modes and files NUMFORMER_KERNELS and NUMFORMER_KERNELS_OFF name: the one list, which
# numformer/kernels/ (their code) reads too.
KERNEL_MODES = ("fast", "plain")
KERNEL_FILES = ("attention", "layernorm", "linear", "relu", "embedding", "loss", "adam", "decoding", "dropout")
# A yes/no variable: these words, any case; empty is the default.
NO_WORDS, YES_WORDS = ("0", "false", "no", "off"), ("1", "true", "yes", "on")
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")


class EnvironmentVariableError(NumformerError, ValueError):
    """A numformer variable of the environment holds a value it cannot use; the line names the variable, the
    value and the values it takes (a value from the environment is never reported as a flag typed)."""


def _get(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def _refuse(name: str, takes: str) -> EnvironmentVariableError:
    return EnvironmentVariableError(f"the environment variable {name} holds {_get(name)!r}, which numformer cannot "
                                    f"use: set it to {takes}, or unset it (unset {name})")


def _yes_no(name: str, default: bool) -> bool:
    value = _get(name).strip().lower()
    if not value:
        return default
    if value not in NO_WORDS + YES_WORDS:
        raise _refuse(name, "1 or 0 (yes or no)")
    return value in YES_WORDS


def kernel_mode() -> str:
    """``NUMFORMER_KERNELS``, lower-cased (``fast`` when unset or empty); another value: refused."""
    mode = _get("NUMFORMER_KERNELS", "fast").strip().lower() or "fast"
    if mode not in KERNEL_MODES:
        raise _refuse("NUMFORMER_KERNELS", " or ".join(KERNEL_MODES))
    return mode


def kernels_off() -> list[str]:
    """``NUMFORMER_KERNELS_OFF``: the kernel files left out; a name that is not one is refused."""
    names = [name.strip() for name in _get("NUMFORMER_KERNELS_OFF").split(",") if name.strip()]
    if any(name not in KERNEL_FILES for name in names):
        raise _refuse("NUMFORMER_KERNELS_OFF", "kernel files separated by commas, from " + ", ".join(KERNEL_FILES))
    return names


def num_threads() -> int | None:
    """``NUMFORMER_NUM_THREADS`` (a positive integer, else refused), else ``OMP_NUM_THREADS`` when a positive
    integer (OpenMP's own variable: its other forms are OpenMP's business, not refused here); else None."""
    value = _get("NUMFORMER_NUM_THREADS").strip()
    if value:
        if not (value.isdigit() and int(value) > 0):
            raise _refuse("NUMFORMER_NUM_THREADS", "a number of threads (1, 2, ...)")
        return int(value)
    value = _get("OMP_NUM_THREADS").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def host_tuning_wanted(tuning: str) -> bool:
    """Whether the host tuning ``"blas"`` (``NUMFORMER_BLAS_TUNE``) or ``"malloc"``
    (``NUMFORMER_MALLOC_TUNE``) may run: not when set to 0, nor when the kernels are off."""
    variable = {"blas": "NUMFORMER_BLAS_TUNE", "malloc": "NUMFORMER_MALLOC_TUNE"}[tuning]
    return _yes_no(variable, True) and kernel_mode() != "plain"


def device() -> str | None:
    """``NUMFORMER_DEVICE`` (None when unset or empty): ``cpu``, ``cuda`` or ``cuda:N``, else refused."""
    value = _get("NUMFORMER_DEVICE").strip()
    if value and not DEVICE_PATTERN.fullmatch(value):
        raise _refuse("NUMFORMER_DEVICE", "cpu, cuda or cuda:N")
    return value or None


def debug() -> bool:
    """``NUMFORMER_DEBUG``: 1 (yes) shows a traceback instead of a one-line error; 0 or empty, not."""
    return _yes_no("NUMFORMER_DEBUG", False)


def cuda_unproven() -> bool:
    """``NUMFORMER_CUDA_UNPROVEN``: run CUDA kernels whose source no GPU run has proven (default no)."""
    return _yes_no("NUMFORMER_CUDA_UNPROVEN", False)


def check_all() -> None:
    """Every numformer variable of the environment read once: the first one whose value cannot be used
    raises :class:`EnvironmentVariableError` (the front calls this when a command starts)."""
    kernel_mode(), kernels_off(), num_threads(), device(), debug(), cuda_unproven()
    host_tuning_wanted("blas"), host_tuning_wanted("malloc")


def cache_root() -> Path:
    """``$NUMFORMER_CACHE``, else ``$XDG_CACHE_HOME/numformer``, else ``~/.cache/numformer``."""
    if _get("NUMFORMER_CACHE"):
        return Path(_get("NUMFORMER_CACHE"))
    base = Path(_get("XDG_CACHE_HOME")) if _get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "numformer"


def sword_path() -> Path | None:
    """``SWORD_PATH``: a folder of SWORD modules to look in first (None when unset)."""
    return Path(_get("SWORD_PATH")) if _get("SWORD_PATH") else None


def launched_size() -> int | None:
    """Processes the MPI launcher started, from its environment; None when it does not say."""
    for name in LAUNCHER_SIZE_VARS:
        if _get(name).isdigit():
            return int(_get(name))
    return None


def launched_rank() -> int | None:
    """This process's rank according to the launcher's environment; None without one."""
    for name in LAUNCHER_RANK_VARS:
        if _get(name).isdigit():
            return int(_get(name))
    return None


def under_launcher() -> bool:
    """Whether any launcher rank variable is set (a launcher that names a rank but no size)."""
    return any(name in os.environ for name in LAUNCHER_RANK_VARS)


# -- variables set for other libraries -----------------------------------------------------------------

def set_blas_thread_timeout(value: str) -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` unless the user set it; True if set here."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = value
    return True


def set_cupy_tf32(value: str | None) -> str | None:
    """Set ``CUPY_TF32`` to ``value`` (None: unset it); returns what it was before (None: unset)."""
    before = os.environ.get("CUPY_TF32")
    if value is None:
        os.environ.pop("CUPY_TF32", None)
    else:
        os.environ["CUPY_TF32"] = value
    return before
