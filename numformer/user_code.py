"""Code a user wrote, run by numformer: a layer to check, an exercise to grade, a class to train with.

Two things every such caller needs, kept here once:

* :func:`load_file` imports a ``.py`` file by its path (it need not be on ``sys.path``), turning
  the ways that fails (no such file, not Python, a syntax error, an exception at import) into a
  :class:`UserCodeError` whose message is one line saying what to fix;
* :func:`exception_line` says in one line what an exception raised inside the user's code was
  and where it came from (``my_layernorm.py:42 in layernorm_backward``), instead of a traceback:
  the user wrote a few lines, and the one that failed is what they need.
"""
from __future__ import annotations

import importlib.util
import itertools
import sys
import traceback
from pathlib import Path

from .errors import UsageError

_LIBRARY_DIRS = None
_counter = itertools.count()


class UserCodeError(UsageError):
    """A user's file cannot be used (missing, unimportable, lacking a name); the message says what to do."""


def load_file(path) -> object:
    """Import the Python file at ``path`` as a fresh module (a new module object on every call).

    Its folder is put first on ``sys.path`` while it imports, so it can import files beside it.
    """
    path = Path(path)
    if not path.is_file():
        raise UserCodeError(f"{path}: no such file")
    if path.suffix != ".py":
        raise UserCodeError(f"{path}: not a Python file (.py)")
    name = f"numformer_user_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    folder = str(path.resolve().parent)  # resolved now: the file's code may change the working directory
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise UserCodeError(f"{path}:{exc.lineno}: {exc.msg}: fix the file, then run again") from None
    except Exception as exc:  # noqa: BLE001  (anything the user's module does at import)
        sys.modules.pop(name, None)
        raise UserCodeError(f"{path} does not import: {exception_line(exc, path)}") from None
    finally:
        sys.path.remove(folder)
    return module


def library_dirs() -> tuple:
    """Folders whose frames are not the user's: numformer, grad_checks, numpy and the standard library."""
    global _LIBRARY_DIRS
    if _LIBRARY_DIRS is None:
        import numpy  # noqa: PLC0415

        here = Path(__file__).resolve().parent
        dirs = [here, here.parent / "grad_checks", Path(numpy.__file__).resolve().parent,
                Path(traceback.__file__).resolve().parent]
        _LIBRARY_DIRS = tuple(str(d) for d in dirs)
    return _LIBRARY_DIRS


def where(exc: BaseException, file=None) -> str:
    """``file.py:LINE in function`` of the innermost frame of ``exc`` in ``file`` (when given and
    present), else in code outside numformer, numpy and the standard library, else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    chosen = None
    if file is not None:
        target = str(Path(file).resolve())
        mine = [f for f in frames if str(Path(f.filename).resolve()) == target]
        chosen = mine[-1] if mine else None
    if chosen is None:
        lib = library_dirs()
        outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(lib)]
        chosen = outside[-1] if outside else frames[-1]
    return f"{Path(chosen.filename).name}:{chosen.lineno} in {chosen.name}"


def exception_line(exc: BaseException, file=None) -> str:
    """``ValueError at my_layernorm.py:42 in layernorm_backward: operands could not be broadcast ...``."""
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    return f"{type(exc).__name__} at {where(exc, file)}" + (f": {message}" if message else "")
