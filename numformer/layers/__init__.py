"""The layers of the Transformer, one concept per file, each with forward and backward.

Each is registered once in :mod:`numformer.layers.registry`, where the model reads the classes it builds: the
layers below by ``@registered`` on their classes (importing them here registers them), each activation by its row of
:mod:`numformer.activations` and each norm by its row of :mod:`numformer.norms` (its module imported, its class
registered and exported here, by the row alone).
"""
from importlib import import_module

from ..activations import ACTIVATIONS
from ..norms import NORMS
from .attention import MultiHeadAttention, ScaledDotProductAttention
from .dropout import Dropout
from .embedding import Embedding
from .feedforward import FeedForward
from .layernorm import LayerNorm
from .learned_positions import LearnedPositionalEmbedding
from .linear import Linear
from .positional import PositionalEncoding
from .projection import OutputProjection
from .registry import registered
from .sublayer import Residual

__all__ = [
    "Dropout", "Embedding", "FeedForward", "LayerNorm", "LearnedPositionalEmbedding", "Linear", "MultiHeadAttention",
    "OutputProjection", "PositionalEncoding", "Residual", "ScaledDotProductAttention",
]


for _row in (*ACTIVATIONS.values(), *NORMS.values()):  # ReLU, SiLU, ..., LayerNorm, ...: each table's rows, each
    globals()[_row.layer] = registered(getattr(import_module(_row.module), _row.layer))  # class registered by name
    if _row.layer not in __all__:
        __all__.append(_row.layer)
del _row
