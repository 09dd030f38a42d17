"""Models from elsewhere in and out of numformer: a translation of names and conventions, not a second model.

One module per outside format: :mod:`numformer.interop.marian` (Hugging Face ``MarianMTModel``, the
Helsinki-NLP opus-mt family) maps its parameters to numformer's and back, :mod:`numformer.interop.ctranslate2`
writes numformer models for the CTranslate2 engine (and says how to search with it as numformer does), and
:mod:`numformer.interop.hf_files` reads a user's Hugging Face files so that anything wrong with one is a
one-line :class:`InteropError` naming the file and the field. The outside packages
(``transformers``, ``huggingface_hub``) are the optional ``interop`` extra and are imported inside
functions only: numformer itself never needs them.
"""
from __future__ import annotations

from ..errors import NumformerError


class InteropError(NumformerError, ValueError):
    """A model from elsewhere that numformer cannot read or write (or cannot fetch); the message is one line."""


__all__ = ["InteropError"]
