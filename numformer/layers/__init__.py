"""The layers of the Transformer, one concept per file, each with forward and backward.

Each is registered in :mod:`numformer.layers.registry`, where the model reads the classes it builds.
"""
from .attention import MultiHeadAttention, ScaledDotProductAttention
from .dropout import Dropout
from .embedding import Embedding
from .feedforward import FeedForward
from .layernorm import LayerNorm
from .learned_positions import LearnedPositionalEmbedding
from .linear import Linear
from .positional import PositionalEncoding
from .projection import OutputProjection
from .registry import register
from .relu import ReLU
from .silu import SiLU
from .sublayer import Residual

__all__ = [
    "Dropout", "Embedding", "FeedForward", "LayerNorm", "LearnedPositionalEmbedding", "Linear", "MultiHeadAttention",
    "OutputProjection", "PositionalEncoding", "ReLU", "Residual", "ScaledDotProductAttention", "SiLU",
]

register(Dropout, Embedding, FeedForward, LayerNorm, LearnedPositionalEmbedding, Linear, MultiHeadAttention,
         OutputProjection, PositionalEncoding, ReLU, Residual, ScaledDotProductAttention, SiLU)
