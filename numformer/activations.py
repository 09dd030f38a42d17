"""The feed-forward network's activations (Eq. 2's ``max(0, .)`` and what may stand in its place): one row each,
the one table every place that names an activation reads.

Each :class:`Activation` row holds

* ``name``: ``ModelConfig.activation`` (what a config, a preset and a model file say);
* ``layer``: the layer class's name in :mod:`numformer.layers.registry`; the class lives in
  ``numformer/layers/<name>.py`` (:attr:`Activation.module`) with its math as ``<name>_forward(x) -> (y, *saved)``
  and ``<name>_backward(dy, *saved) -> dx``; the row registers it (``numformer.layers`` imports the module);
* ``transformers``: the ``activation_function`` names of a Hugging Face config (transformers' ``ACT2FN``) that
  compute this function: a Marian import accepts each, an export writes the first;
* ``ctranslate2``: the member of ``ctranslate2.specs.common_spec.Activation`` the CTranslate2 export sets;
* ``torch``: what the PyTorch mirror (tests/reference/torch_mirror.py) calls, a function of
  ``torch.nn.functional`` and its keyword arguments (strings: numformer never imports torch).

Ground floor: this module imports nothing of numformer (the layers, the registry, the config, interop and the
tests all read it). Adding an activation is its layer file, its test, one row here and the docs
(docs/layout.md, "Adding an activation").
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Activation:
    """One activation: its config name, layer, transformers' and CTranslate2's names, the mirror's function."""

    name: str
    layer: str
    transformers: tuple
    ctranslate2: str
    torch: str
    torch_kwargs: dict = field(default_factory=dict)

    @property
    def module(self) -> str:
        """The module that defines the layer class (and its forward and backward functions)."""
        return f"numformer.layers.{self.name}"

    @property
    def forward_name(self) -> str:
        return f"{self.name}_forward"

    @property
    def backward_name(self) -> str:
        return f"{self.name}_backward"


#: ModelConfig.activation -> its row; the first is the paper's (the default).
ACTIVATIONS = {row.name: row for row in (
    Activation("relu", "ReLU", ("relu",), "RELU", "relu"),
    Activation("silu", "SiLU", ("swish", "silu"), "SWISH", "silu"),
    Activation("gelu", "GELU", ("gelu",), "GELU", "gelu"),
    Activation("gelu_tanh", "GELUTanh", ("gelu_new", "gelu_pytorch_tanh"), "GELUTanh", "gelu", {"approximate": "tanh"}),
)}


def activation(name: str) -> Activation:
    """The row of ``name`` (``ModelConfig.activation``); ValueError naming the choices otherwise."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def from_transformers(function: str) -> Activation | None:
    """The row whose function transformers computes under ``activation_function`` = ``function``, or None."""
    return next((row for row in ACTIVATIONS.values() if function in row.transformers), None)


def transformers_names() -> list:
    """Every ``activation_function`` name an import accepts, in the table's order."""
    return [n for row in ACTIVATIONS.values() for n in row.transformers]


def layer_modules() -> dict:
    """layer name -> the module that defines it, for every activation (what the registry imports on demand)."""
    return {row.layer: row.module for row in ACTIVATIONS.values()}
