"""Re-export of ``bench/torch_mirror.py``, the PyTorch mirror of numformer's layers and model.

The mirror lives in ``bench/`` because the decoding bench loads checkpoints into it too (the bench
must not import from ``tests/``); the tests keep importing ``torch_mirror`` from here. It is loaded by
file path, so it works whether or not the repository root is on ``sys.path``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "numformer_bench_torch_mirror"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        _NAME, Path(__file__).resolve().parent.parent / "bench" / "torch_mirror.py")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _module  # registered before it runs: its dataclasses look their module up
    _spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(sys.modules[_NAME]).items() if not k.startswith("__")})
