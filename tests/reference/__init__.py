"""Reference code shared by the tests and the benches, outside the installed package.

* ``torch_mirror``: an independent PyTorch float64 implementation of every layer and of the whole
  model, loaded with numformer's weights (parity tests; the safetensors and decoding checks);
* ``torch_decode``: numformer's searches written in torch on the mirror's weights (the decoding
  test and ``bench/decode.py``);
* ``torch_reference``: eager PyTorch models of the same shapes, the speed competitor of
  ``bench/train_step.py`` and ``bench/gpu_train_step.py``;
* ``kernel_cases``: real-size inputs for every fast kernel and its plain function
  (``tests/kernels/test_kernels.py`` and ``bench/kernel_speed.py``).

They live here, beside the tests, because the tests are what proves numformer against them (CI runs
the tests on every commit, the benches run by hand): a bench times against a reference the tests
hold equal, so the benches import from here (``sys.path.insert(0, ROOT / "tests")``), never the
tests from ``bench/``. Import as ``from reference import torch_mirror`` (``tests/`` is on the path
under pytest).
"""
