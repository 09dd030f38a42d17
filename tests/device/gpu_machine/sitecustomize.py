"""Make this Python see only the GPU machine's packages (packages.txt beside this file), numformer not installed.

Put this folder on PYTHONPATH (Python imports ``sitecustomize`` at start-up, children inherit it):

* every top-level module of a distribution installed here that the GPU machine's image lacks is refused with
  ``ModuleNotFoundError`` (ctranslate2, datasets, sacremoses, pysword, ...), and such distributions are hidden
  from ``importlib.metadata`` (pytest loads its plugins from there: platformdirs registers one);
* numformer's editable install is removed, so numformer and grad_checks import only from a folder on
  ``sys.path`` (the tree, as on the GPU machine, where nothing is installed).

So the GPU acceptance's dry run under this folder fails here where it would fail there for want of a package
(tests/device/test_gpu_acceptance.py). Python's own version is not emulated (3.12 there).
"""
import importlib.abc
import importlib.metadata
import sys
from pathlib import Path


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


_THERE = {_normal(word) for line in (Path(__file__).with_name("packages.txt")).read_text().splitlines()
          if not line.startswith("#") for word in line.split()}
_real_distributions = importlib.metadata.distributions


def _kept(dist) -> bool:
    return _normal(dist.metadata["Name"] or "") in _THERE


# every top-level module installed here none of whose distributions the GPU machine has (read once: this runs at
# the start of every Python process under the emulation)
_REFUSED = {m for m, dists in importlib.metadata.packages_distributions().items()
            if not any(_normal(d) in _THERE for d in dists) and not m.startswith("__editable__")
            and m not in ("numformer", "grad_checks")}


class _RefuseMissing(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in _REFUSED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (not on the GPU machine: "
                                      f"tests/device/gpu_machine/sitecustomize.py)", name=fullname)
        return None


def _distributions(**kwargs):
    return (d for d in _real_distributions(**kwargs) if _kept(d))


importlib.metadata.distributions = _distributions
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.meta_path.insert(0, _RefuseMissing())
