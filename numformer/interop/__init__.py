"""Models from elsewhere in and out of numformer: a translation of names and conventions, not a second model.

Hugging Face ``MarianMTModel`` (the Helsinki-NLP opus-mt family): :mod:`numformer.interop.marian` names what
there is; :mod:`~numformer.interop.marian_weights` maps its parameters to numformer's and back (the sinusoid
column permutation), :mod:`~numformer.interop.marian_config` its ``config.json``,
:mod:`~numformer.interop.hf_folder` reads a model folder's weights and fetches a Hub id,
:mod:`~numformer.interop.marian_import` writes a numformer model file from such a folder and
:mod:`~numformer.interop.marian_export` a folder from a numformer model. CTranslate2:
:mod:`numformer.interop.ctranslate2` writes numformer models for its engine (and says how to search with it
as numformer does). A user's Hugging Face files are read through :mod:`numformer.data.hf_files`, so that
anything wrong with one is a one-line :class:`InteropError` naming the file and the field.

This package sits above the model file (:mod:`numformer.checkpoint`) and the data (:mod:`numformer.data`),
which never import it. The outside packages (``transformers``, ``huggingface_hub``, ``ctranslate2``) are
optional extras and are imported inside functions only: numformer itself never needs them.
"""
from __future__ import annotations

from ..data.hf_files import InteropError

__all__ = ["InteropError"]
