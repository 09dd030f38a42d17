"""The layer classes the model builds, by name: the one place a user's class can stand in for numformer's.

Every place numformer builds one of these layers reads its class here, ``layer_class("LayerNorm")(d_model)``
(or, from a model config, ``built("Residual", cfg, ...)``: the class's ``from_config``), instead of naming the class, so putting another class under a name (:func:`replaced`, what
``train.py --swap`` and :mod:`numformer.swap` do) reaches every use of that layer at once::

    with replaced({"LayerNorm": MyLayerNorm}):
        model = Transformer(cfg)        # every LayerNorm in it is a MyLayerNorm
    # restored here; the model keeps its MyLayerNorms

A layer is registered once, where it is defined: ``@registered`` on its class (the layers, the stacks of
``numformer.model``, the loss), or, for an activation, its row of :mod:`numformer.activations` (``numformer.layers``
imports and registers each row's class). :data:`REGISTERING` names the modules whose import registers every
class. This module imports no other part of numformer at import time, so each of them may import it without a
circle; a layer asked for before its module was imported has those modules imported then.
"""
from __future__ import annotations

import contextlib
import importlib

#: The modules whose import registers every class (in this order: numformer_classes() keeps it).
REGISTERING = ("numformer.layers", "numformer.model", "numformer.loss")

_OWN: dict = {}       # name -> numformer's own class, as registered
_REPLACED: dict = {}  # name -> the class put in its place now (inside a replaced() block)


def registered(cls: type) -> type:
    """Class decorator: register ``cls`` as numformer's own class under its name (returns it unchanged).
    A class of another module or name under a name already registered is a ValueError (two layers may not
    share a name); the same class defined again (its module reloaded) takes its place."""
    old = _OWN.get(cls.__name__)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise ValueError(f"two layer classes named {cls.__name__}: {old.__module__} and {cls.__module__}")
    _OWN[cls.__name__] = cls
    return cls


def register(*classes) -> None:
    """Register numformer's own classes under their names (what ``@registered`` does, for several at once)."""
    for cls in classes:
        registered(cls)


def _import_all() -> None:
    for module in REGISTERING:
        importlib.import_module(module)


def _known(name: str) -> None:
    """KeyError unless ``name`` is registered. A layer whose module is not imported yet (the trainer builds the
    loss without importing ``numformer.loss`` itself) is registered by importing :data:`REGISTERING`: those
    modules are the layers, the model and the loss, which import this one only to register."""
    if name not in _OWN:
        _import_all()
    if name not in _OWN:
        raise KeyError(f"no layer class registered as {name!r}: choose from {', '.join(numformer_classes())}")


def layer_class(name: str) -> type:
    """The class numformer builds as ``name`` now: the one put in by :func:`replaced`, else numformer's own."""
    _known(name)
    return _REPLACED.get(name, _OWN[name])


def built(name: str, cfg, *args, **kwargs):
    """The layer ``name`` built from a model config (a :class:`numformer.presets.ModelConfig`):
    ``layer_class(name).from_config(cfg, *args, **kwargs)``, the class's own reading of the fields it needs. A
    class put in numformer's place that has no ``from_config`` (one written against the constructor alone) is
    built by numformer's reading, run with that class: it gets the arguments numformer's constructor gets."""
    cls = layer_class(name)
    if hasattr(cls, "from_config"):
        return cls.from_config(cfg, *args, **kwargs)
    return _OWN[name].from_config.__func__(cls, cfg, *args, **kwargs)


def numformer_classes() -> dict:
    """name -> numformer's own class, for every registered layer: the layers of ``numformer.layers`` by name,
    then the model's stacks and the loss as registered."""
    _import_all()
    group = {module: i for i, module in enumerate(REGISTERING)}
    place = {name: i for i, name in enumerate(_OWN)}

    def order(name):
        module = _OWN[name].__module__
        g = next((group[m] for m in REGISTERING if module == m or module.startswith(m + ".")), len(group))
        return (g, name if g == 0 else "", place[name])

    return {name: _OWN[name] for name in sorted(_OWN, key=order)}


@contextlib.contextmanager
def replaced(classes: dict):
    """Inside the block numformer builds ``classes[name]`` wherever it builds the layer ``name``.

    Layers built inside the block keep their class after it; on exit each name gets back the class it
    had before the block (numformer's, or that of an enclosing block). Raises KeyError for a name that is
    not registered.
    """
    for name in classes:
        _known(name)
    saved = {name: _REPLACED.get(name) for name in classes}
    _REPLACED.update(classes)
    try:
        yield
    finally:
        for name, cls in saved.items():
            if cls is None:
                _REPLACED.pop(name, None)
            else:
                _REPLACED[name] = cls


@contextlib.contextmanager
def numformer_only():
    """Inside the block numformer builds its own classes again, whatever :func:`replaced` put in (to build a
    model to compare with); the replacements come back on exit."""
    saved = dict(_REPLACED)
    _REPLACED.clear()
    try:
        yield
    finally:
        _REPLACED.clear()
        _REPLACED.update(saved)
