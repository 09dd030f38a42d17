"""The one exception type for user-facing data problems."""
from __future__ import annotations

from ..errors import NumformerError


class DataError(NumformerError, ValueError):
    """A problem with the user's data or environment, not a bug in numformer.

    The message is one line that says what is wrong and what to do about it,
    naming the file (and the 1-based line number) where that applies, so a
    command-line tool can print it without a traceback.
    """
