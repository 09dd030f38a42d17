"""Hugging Face Marian (``MarianMTModel``, the opus-mt family) in and out of numformer: the public names.

Marian computes what numformer computes (post-LN layers, sinusoidal positions, embeddings scaled by
sqrt(d_model) and tied with the output projection), so a model passes from one to the other by names
and conventions alone. Each job has its file, and this module names what they offer:

* :mod:`numformer.interop.marian_weights`: the parameter names and the sinusoid column permutation;
* :mod:`numformer.interop.marian_config`: ``config.json`` <-> ModelConfig, the special ids, what Marian
  cannot hold;
* :mod:`numformer.interop.hf_folder`: a model folder's files and weights, a Hub id fetched;
* :mod:`numformer.interop.marian_import`: :func:`import_marian` (``python -m numformer.checkpoint import``)
  writes an ordinary numformer model file from a folder written by ``MarianMTModel.save_pretrained`` +
  ``MarianTokenizer.save_pretrained`` (or a Hub id);
* :mod:`numformer.interop.marian_export`: :func:`export_marian` (``... export RUN --format hf``) writes
  such a folder from a numformer model.

Neither direction needs ``transformers`` (``safetensors`` reads and writes the weights; ``torch`` only for
a legacy ``pytorch_model.bin``, ``huggingface_hub`` only to fetch).
"""
from __future__ import annotations

from .hf_folder import (GENERATION_CONFIG, HUB_PATTERNS, SAFETENSORS, SAFETENSORS_INDEX,
                        SPECIAL_TOKENS_MAP, TOKENIZER_CONFIG, TORCH_BIN, fetch, read_hf_weights)
from .marian_config import (ACTIVATIONS, CONFIG, MARIAN_ACTIVATION, MARIAN_LN_EPS, generation_config,
                            marian_config_from_numformer, marian_special_ids, model_config_from_marian)
from .marian_export import export_marian, export_marian_model
from .marian_import import import_marian
from .marian_weights import (EMBEDDING, HIDDEN, LOGITS_BIAS, POSITION_NAMES, READS, SHARED_NAMES, STREAM, WRITES,
                             marian_permutation, marian_sinusoids, marian_to_numformer, numformer_to_marian,
                             parameter_map)

__all__ = ["marian_permutation", "marian_sinusoids", "parameter_map", "marian_to_numformer", "numformer_to_marian",
           "marian_special_ids", "model_config_from_marian", "marian_config_from_numformer", "generation_config",
           "read_hf_weights", "fetch", "import_marian", "export_marian", "export_marian_model",
           "SAFETENSORS", "SAFETENSORS_INDEX", "TORCH_BIN", "CONFIG", "GENERATION_CONFIG", "TOKENIZER_CONFIG",
           "SPECIAL_TOKENS_MAP", "HUB_PATTERNS", "ACTIVATIONS", "MARIAN_ACTIVATION", "MARIAN_LN_EPS",
           "EMBEDDING", "READS", "WRITES", "STREAM", "HIDDEN", "LOGITS_BIAS", "SHARED_NAMES", "POSITION_NAMES"]
