"""The norms of the residual sub-layers (Section 3.1's LayerNorm and what may stand in its place): one row each,
the one table every place that builds, counts, mirrors or exports a norm reads.

Each :class:`Norm` row holds

* ``name``: ``ModelConfig.norm`` (what a config, a preset and a model file say);
* ``layer``: the layer class's name in :mod:`numformer.layers.registry`; the class lives in
  ``numformer/layers/<name>.py`` (:attr:`Norm.module`), takes ``(d, eps=..., dtype=...)`` and normalises the last
  axis; the row registers it (``numformer.layers`` imports the module). Every Residual's norm and a pre-LN
  stack's final norm are this class (numformer.layers.sublayer.norm_from_config);
* ``parameters``: the names of the layer's parameters, each a (d,) vector, in the order the PyTorch function
  takes them: the parameter count (numformer.presets.count_parameters), the mirror and the exports read them;
* ``torch``: the function of ``torch.nn.functional`` the PyTorch mirror (tests/reference/torch_mirror.py) calls,
  as ``F.<torch>(x, (d,), *parameters, eps=ln_eps)`` (a string: numformer never imports torch);
* ``ctranslate2``: the keyword arguments of CTranslate2's ``TransformerEncoderSpec`` and
  ``TransformerDecoderSpec`` that select this norm (``{}``: their default, LayerNorm; ``{"rms_norm": True}``), its
  parameters set as the ``LayerNormSpec``'s ``gamma`` (``weight``) and ``beta`` (``bias``); None: CTranslate2
  cannot hold it and the export refuses it in one line;
* ``marian``: whether transformers' ``MarianMTModel`` computes it (``nn.LayerNorm``): the Marian export refuses a
  model whose norm it does not.

Ground floor: this module imports nothing of numformer. Adding a norm is its layer file, its test, one row here
and the docs (docs/layout.md, "Adding a norm").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Norm:
    """One norm: its config name, layer, parameters, the mirror's function and what the exports make of it."""

    name: str
    layer: str
    parameters: tuple
    torch: str
    ctranslate2: dict | None
    marian: bool

    @property
    def module(self) -> str:
        """The module that defines the layer class."""
        return f"numformer.layers.{self.name}"


#: ModelConfig.norm -> its row; the first is the paper's (the default).
NORMS = {row.name: row for row in (
    Norm("layernorm", "LayerNorm", ("weight", "bias"), "layer_norm", {}, True),
)}


def norm(name: str) -> Norm:
    """The row of ``name`` (``ModelConfig.norm``); ValueError naming the choices otherwise."""
    if name not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {name!r}")
    return NORMS[name]
