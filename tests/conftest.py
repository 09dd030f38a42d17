"""Shared pytest set-up: the ``gpu`` marker skips without cupy and a CUDA device."""
import pytest


def cuda_available() -> bool:
    try:
        from numformer.backend import import_cupy

        import_cupy()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs cupy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
