"""The kernels: fast versions of pieces of the math, and the one switch that turns them off.

``numformer/layers/``, ``loss.py``, ``optim.py`` and ``decoding/search.py`` hold the plain math: each piece
of a forward or backward pass is a function written as the paper's equations (for example
:func:`numformer.layers.attention.attention_backward`). This package holds faster versions of some of
those functions, each named after its plain twin with ``_fast`` (``attention_backward_fast``): the same
inputs, the same outputs (equal to the plain ones up to float rounding; tested at real training sizes in
``tests/kernels/test_kernels.py``), computed with host threads, cache-sized blocks, ``out=`` buffers and
fused passes. A layer calls a piece of math through :func:`kernel`::

    dq, dk, dv = kernel(attention_backward)(dout, q, k, v, p, p_used, masked, scale, dropout_backward)

which returns the fast version registered for ``attention_backward`` when kernels are on, the plain
function itself when they are off. The kernel files register their functions by the plain function's
dotted name (:mod:`numformer.kernels.twins`): the math imports this switch, the switch imports the kernel
files, and no kernel file imports the math, so the arrows run one way. The training kernels (attention,
LayerNorm, the linear maps, ReLU, the embedding's scatter-add, the loss, Adam) take host (numpy) arrays;
with cupy arrays the switch runs the plain math (the GPU runs its own kernels for every array operation),
except where a file holds a CUDA kernel for them that may run (:mod:`numformer.kernels.cuda_sources`: Adam,
dropout, the attention softmax).
The two decoding kernels go through ``xp`` and run on both.

The switch: ``NUMFORMER_KERNELS=plain`` in the environment, or ``numformer.kernels.use_kernels("plain")``
(``"fast"`` is the default), runs the whole model on the plain math, on CPU and GPU; the process
tunings of :mod:`numformer.kernels.host` (glibc's allocator, OpenBLAS's thread spin) are skipped too when
the environment says ``plain``. ``NUMFORMER_KERNELS_OFF=attention,loss`` leaves out single kernel
files (to measure what each buys: ``bench/kernel_speed.py``, ``docs/speed.md``).

Files, one per piece of math: ``attention``, ``layernorm``, ``linear`` (the bias added in place, its
gradient as a GEMV), ``relu``, ``embedding``, ``loss``, ``adam``, ``decoding`` (the per-step pieces of the
searches) and ``dropout``; :mod:`numformer.kernels.twins` is their table. Dropout has no host kernel
(docs/speed.md has the measurements): its kernel is the GPU's, a CUDA kernel that makes the mask from the
counter-based generator (:mod:`numformer.counter_rng`), scales and adds the residual in one launch; the
attention file's twins also run CUDA kernels for cupy arrays (the softmax with its scale and mask, forward and
backward). The host thread pool the kernels split work over is :mod:`numformer.kernels.host.threads`.
"""
from __future__ import annotations

import contextlib

from .. import environment
from ..errors import NumformerError

MODES = environment.KERNEL_MODES
_FAST_MODULES = environment.KERNEL_FILES


class KernelModeError(NumformerError, ValueError):
    """An unknown kernel mode; the message lists the choices."""


def _check(mode: str) -> str:
    if mode not in MODES:
        raise KernelModeError(f"unknown kernel mode {mode!r}: use {' or '.join(MODES)} "
                              "(NUMFORMER_KERNELS or numformer.kernels.use_kernels)")
    return mode


# The mode and the files left out are read from the environment at first use, not at import: a bad value
# is then one line from the command's front (or the same error where a library caller first asks),
# never a traceback out of ``import numformer``. None: not read yet.
_mode = None
_off = None  # kernel files left out (measurements of what each one buys)
_chosen = {}        # plain function -> what kernel() returns for it in fast mode (built once)


def _twin_of(plain):
    """The :class:`~numformer.kernels.twins.Twin` registered for ``plain``, or None. The kernel files are
    imported here (each registers its functions in :data:`numformer.kernels.twins.TWINS`; Python imports each
    once): on the first call in fast mode, not on import, so the plain mode never pays for them."""
    from .twins import name_of  # noqa: PLC0415

    return _registry().get(name_of(plain))


def _registry() -> dict:
    """:data:`numformer.kernels.twins.TWINS`, every kernel file imported."""
    from . import adam, attention, decoding, dropout, embedding, layernorm, linear, loss, relu  # noqa: F401,PLC0415
    from .twins import TWINS  # noqa: PLC0415  (imports numpy: not before tune_host, see host/)

    return TWINS


def _current_mode() -> str:
    """The mode: set by :func:`use_kernels`, else ``NUMFORMER_KERNELS`` (read once, here)."""
    global _mode
    if _mode is None:
        _mode = environment.kernel_mode()
    return _mode


def _left_out() -> frozenset:
    """The kernel files left out: set by :func:`set_disabled`, else ``NUMFORMER_KERNELS_OFF`` (read once, here)."""
    global _off
    if _off is None:
        _off = frozenset(environment.kernels_off())
    return _off


def _choose(plain):
    """The fast twin of ``plain`` (or a function choosing between the two by ``when``), else ``plain``."""
    left_out = _left_out()  # read (and refused when bad) at the first choice, whether or not plain has a twin
    twin = _twin_of(plain)
    if twin is None or twin.file in left_out:
        return plain
    if twin.when is None:
        return twin.fast
    fast, when = twin.fast, twin.when

    def fast_where_it_applies(*args, **kwargs):
        return fast(*args, **kwargs) if when(*args, **kwargs) else plain(*args, **kwargs)
    fast_where_it_applies.fast = fast
    return fast_where_it_applies


def kernel(plain):
    """The function to run for the piece of math ``plain``: its fast version, or ``plain`` itself."""
    if (_mode or _current_mode()) == "plain":
        return plain
    chosen = _chosen.get(plain)
    if chosen is None:
        chosen = _chosen[plain] = _choose(plain)
    return chosen


def set_disabled(names) -> frozenset:
    """Leave out the kernels of these files (e.g. ``{"attention"}``: its plain math runs instead)
    while the others stay on; returns the previous set. For measuring what each kernel buys
    (``NUMFORMER_KERNELS_OFF=attention,loss python3 bench/train_step.py ...`` does the same)."""
    global _off
    names = frozenset(names)
    unknown = names - set(_FAST_MODULES)
    if unknown:
        raise KernelModeError(f"unknown kernel {sorted(unknown)[0]!r}: choose from {', '.join(_FAST_MODULES)}")
    previous, _off = _left_out(), names
    _chosen.clear()
    return previous


def disabled() -> frozenset:
    """The kernel files left out now (:func:`set_disabled`, else ``NUMFORMER_KERNELS_OFF``)."""
    return _left_out()


def registered() -> dict:
    """{plain function's dotted name: fast function} for every kernel (loads them)."""
    return {name: twin.fast for name, twin in _registry().items()}


def fast_twin(plain):
    """The fast function registered for ``plain`` (None when it has none), whatever the mode."""
    twin = _twin_of(plain)
    return None if twin is None else twin.fast


def get_kernels() -> str:
    """The current mode: 'fast' or 'plain'."""
    return _current_mode()


def use_kernels(mode: str) -> str:
    """Set the mode ('fast' or 'plain') for the whole process; returns the previous one."""
    global _mode
    previous, _mode = _current_mode(), _check(mode)
    return previous


@contextlib.contextmanager
def kernel_mode(mode: str):
    """``with kernel_mode("plain"): ...`` runs the block on the plain math, then restores the mode."""
    previous = use_kernels(mode)
    try:
        yield
    finally:
        use_kernels(previous)

