"""numformer: the Transformer of "Attention Is All You Need" in NumPy/CuPy, every backward pass by hand.

The math is in ``numformer.layers``, ``numformer.loss`` and ``numformer.optim``; the fast
versions of its pieces are in ``numformer.kernels`` (``NUMFORMER_KERNELS=plain`` turns them off);
the host thread pool and the process tunings are in ``numformer.kernels.host`` (not applied on
import: call ``numformer.kernels.host.tune_host()`` before numpy loads, as ``train.py`` does).
The layout: ``docs/layout.md``.
"""
