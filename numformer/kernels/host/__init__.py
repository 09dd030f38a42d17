"""The host process: the thread pool that kernels split work over, and process-wide tunings.

Not math and not kernels: ``threads`` (the pool of host threads and the row/range/task splitters
that :mod:`numformer.kernels` use; ``NUMFORMER_NUM_THREADS``), ``allocator`` (glibc keeps large freed
blocks, applied when numformer is imported) and ``blas_threads`` (OpenBLAS's worker threads sleep
soon after a GEMM; ``train.py`` applies it before numpy loads). ``NUMFORMER_KERNELS=plain`` skips both
tunings, so the plain math runs on an untuned process. Importing this package imports no numpy:
``blas_threads`` must be usable before numpy loads.
"""
