"""Error classes of the command lines that no more specific module owns: a bad request, a training stopped.

The command-line tools (``train.py``, ``translate.py``, ``python -m numformer.checkpoint`` ...) print
an error raised on purpose for bad input as one line and exit 2; every such error has its own class
(:class:`UsageError` here, ``DataError``, ``CheckpointError``, ``BackendError``, ``PrecisionError``,
``DistributedError``). Anything else that escapes, a plain ``ValueError`` from NumPy included, is a bug
in numformer: the tools say so and write its traceback to a file (``cli_common.one_line_errors``).
"""
from __future__ import annotations


class UsageError(ValueError):
    """Flags or settings that cannot work together; the message is one line saying what to do.

    A ValueError, so code that called these checks expecting ValueError keeps working.
    """


class StopTraining(RuntimeError):
    """Training cannot go on (a run of non-finite steps, numformer/trainer.py); the message is one line,
    the last good checkpoint is untouched. Exit status 3."""

    exit_code = 3
