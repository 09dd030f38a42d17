"""The layer classes the model builds, by name: the one place a user's class can stand in for numformer's.

Every place numformer builds one of these layers reads its class here, ``layer_class("LayerNorm")(d_model)``,
instead of naming the class, so putting another class under a name (:func:`replaced`, what
``train.py --swap`` and :mod:`numformer.swap` do) reaches every use of that layer at once::

    with replaced({"LayerNorm": MyLayerNorm}):
        model = Transformer(cfg)        # every LayerNorm in it is a MyLayerNorm
    # restored here; the model keeps its MyLayerNorms

:data:`NAMES` lists the layers, in order, each with the module that registers numformer's own class
(:func:`register`): ``numformer.layers`` for the layers, ``numformer.model`` for the stacks, ``numformer.loss``
for the loss. This module imports no other part of numformer at import time, so each of them may import it
without a circle; a layer asked for before its module was imported has the module imported then.
"""
from __future__ import annotations

import contextlib
import importlib

# name -> the module that registers numformer's own class (in this order: numformer_classes() keeps it)
NAMES = {
    **dict.fromkeys(("Dropout", "Embedding", "FeedForward", "LayerNorm", "LearnedPositionalEmbedding", "Linear",
                     "MultiHeadAttention", "OutputProjection", "PositionalEncoding", "ReLU", "Residual",
                     "ScaledDotProductAttention", "SiLU"),
                    "numformer.layers"),
    **dict.fromkeys(("EncoderLayer", "DecoderLayer", "Encoder", "Decoder"), "numformer.model"),
    "LabelSmoothedCrossEntropy": "numformer.loss",
}

_OWN: dict = {}       # name -> numformer's own class, as registered
_REPLACED: dict = {}  # name -> the class put in its place now (inside a replaced() block)


def register(*classes) -> None:
    """Register numformer's own classes under their names (each must be one of :data:`NAMES`)."""
    for cls in classes:
        if cls.__name__ not in NAMES:
            raise ValueError(f"{cls.__name__} is not one of numformer.layers.registry.NAMES: add it there first")
        _OWN[cls.__name__] = cls


def _known(name: str) -> None:
    """KeyError unless ``name`` is registered. A layer of :data:`NAMES` whose module is not imported yet
    (the trainer builds the loss without importing ``numformer.loss`` itself) is imported here: those
    modules are the layers, the loss and the model, which import this one only to register."""
    if name not in _OWN and name in NAMES:
        importlib.import_module(NAMES[name])
    if name not in _OWN:
        raise KeyError(f"no layer class registered as {name!r}: choose from {', '.join(NAMES)}")


def layer_class(name: str) -> type:
    """The class numformer builds as ``name`` now: the one put in by :func:`replaced`, else numformer's own."""
    _known(name)
    return _REPLACED.get(name, _OWN[name])


def numformer_classes() -> dict:
    """name -> numformer's own class, for every layer of :data:`NAMES`, in that order."""
    for name in NAMES:
        _known(name)
    return {name: _OWN[name] for name in NAMES}


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
