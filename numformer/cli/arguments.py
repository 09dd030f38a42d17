"""Argument parsing for the command lines: a usage error is one line, and the number types say their range."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ... (see prog --help)``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing an empty path (:func:`empty_path_flag`)."""
        given = sys.argv[1:] if args is None else list(args)
        if (flag := empty_path_flag(given)) is not None:
            self.error(f"{flag} is empty (an unset shell variable?): name the file or folder")
        return super().parse_known_args(args, namespace)


#: The flags whose value names a file or folder, in every command: an empty value is never meant. ``--out ''``
#: from an unset shell variable trained into a default folder and prepared into the current one (issue 59).
PATH_FLAGS = frozenset({"--out", "--output", "--data", "--input", "--model", "--reference", "--init-from",
                        "--vocab", "--run", "--run-dir"})


def empty_path_flag(argv) -> str | None:
    """The first path flag of ``argv`` (``--out ''`` or ``--out=``) whose value is empty or only whitespace,
    None when there is none. Read from the words themselves, before a ``type=Path`` turns ``''`` into ``.``."""
    words = [str(w) for w in argv]
    for i, word in enumerate(words):
        if word == "--":
            return None
        flag, eq, value = word.partition("=")
        if flag not in PATH_FLAGS:
            continue
        if eq:
            if not value.strip():
                return flag
        elif i + 1 < len(words) and not words[i + 1].strip():
            return flag
    return None


def path_argument(text: str) -> str:
    """argparse ``type=`` of a positional path (a run folder, a model file, an exercise file): the word as given,
    refused when empty or blank, what an unset shell variable leaves (``python -m numformer.plot "$RUN"``), which
    would otherwise be read as the current folder or reported as a file of no name. :func:`empty_path_flag` does
    the same for the path flags, whose values it finds by the flag's name."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?): name the file or folder")
    return text


path_argument.__name__ = "path"  # what argparse's own messages call the type


# -- the range of every number a command takes --------------------------------------------------------------

#: The largest value of a 32-bit signed integer: numpy's index arrays and sentencepiece's integer settings hold
#: counts this large at most (a larger one overflows inside the library, or asks for more memory than exists).
INT32_MAX = 2 ** 31 - 1
#: The largest value of a 32-bit unsigned integer: sentencepiece's random seed is one (``--seed 99999999999``
#: was a traceback from inside sentencepiece).
UINT32_MAX = 2 ** 32 - 1


class NumberRange:
    """The range of one kind of number (an argparse ``type=`` and the check of the same number read elsewhere,
    such as a run's run.json): ``kind`` int or float, from ``low`` to ``high``, each end included unless
    ``low_open`` / ``high_open``. NaN and the infinities are never in a range. Called on a flag's word it returns
    the value or raises argparse's error, which argparse turns into ``prog: error: argument --flag: must be ...,
    got ...`` (one line, exit 2: the flag and the range named)."""

    def __init__(self, kind, low, high, low_open: bool = False, high_open: bool = False, what: str = ""):
        self.kind, self.low, self.high, self.low_open, self.high_open = kind, low, high, low_open, high_open
        self.what = what
        self.__name__ = what or ("integer" if kind is int else "number")  # what argparse's own messages call it

    def __contains__(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return False
        if self.kind is int and not float(value).is_integer():
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def words(self) -> str:
        """``an integer from 1 to 2147483647``, ``in (0, 1000]``."""
        if self.kind is int:
            return f"an integer from {self.low} to {self.high}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def __call__(self, text):
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value not in self:
            raise argparse.ArgumentTypeError(f"must be {self.words()}, got {text}")
        return value

    def refusal(self, name: str, value) -> str | None:
        """The one line refusing ``value`` given as ``name`` (a flag, or ``RUN/run.json's train_config.seed``), or
        None when it is in range."""
        if value in self:
            return None
        return f"{name} must be {self.words()}, got {value!r}"

    def __repr__(self) -> str:
        return f"NumberRange({self.words()})"


#: Every kind of number the commands take, one row each: a flag's ``type=`` is one of these (tests/faults/
#: test_numbers_in_range.py walks every command's flags and refuses a plain ``int`` or ``float``), and the
#: same row checks the value where it is read back (a resumed run's run.json: numformer/training/config.py).
NUMBERS = {
    "count": NumberRange(int, 1, INT32_MAX),               # steps, tokens, sentences, batches, threads, sizes
    "count or 0": NumberRange(int, 0, INT32_MAX),          # the same where 0 means "off", "all" or "none"
    "seed": NumberRange(int, 0, UINT32_MAX, what="seed"),  # numpy's generators and sentencepiece's (a uint32)
    "beam": NumberRange(int, 1, 1024, what="beam size"),   # beyond the positional table no beam can fill
    "positive": NumberRange(float, 0, 1e12, low_open=True),
    "at least 0": NumberRange(float, 0, 1e12),
    "minutes": NumberRange(float, 0, 1e6, low_open=True, what="minutes"),  # about two years
    "minutes or 0": NumberRange(float, 0, 1e6, what="minutes"),
    "seconds or 0": NumberRange(float, 0, 1e7, what="seconds"),          # about four months
    "rate factor": NumberRange(float, 0, 1000, low_open=True, what="factor"),  # Eq. 3 times this
    "length factor": NumberRange(float, 0, 1024, what="factor"),         # output tokens per source token
    "output length": NumberRange(int, 0, 1024 * 1024),   # output tokens (capped at the positional table anyway)
    "length penalty": NumberRange(float, 0, 10, what="alpha"),           # ((5 + len) / 6) ** alpha
    "probability": NumberRange(float, 0, 1, high_open=True, what="probability"),
    "finite-difference step": NumberRange(float, 0, 0.1, low_open=True, what="step"),
    "tolerance": NumberRange(float, 0, 1, low_open=True, what="tolerance"),
}

positive_int = NUMBERS["count"]
nonneg_int = NUMBERS["count or 0"]
seed_int = NUMBERS["seed"]
beam_size = NUMBERS["beam"]
positive_float = NUMBERS["positive"]
nonneg_float = NUMBERS["at least 0"]
probability = NUMBERS["probability"]
