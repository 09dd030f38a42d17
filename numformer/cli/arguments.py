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


def _checked(kind, test, words):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or not test(value):  # NaN fails every test
            raise argparse.ArgumentTypeError(f"must be {words}, got {text}")
        return value
    parse.__name__ = words
    return parse


positive_int = _checked(int, lambda v: v >= 1, "at least 1")
nonneg_int = _checked(int, lambda v: v >= 0, "at least 0")
positive_float = _checked(float, lambda v: 0 < v < float("inf"), "a positive number")
nonneg_float = _checked(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
probability = _checked(float, lambda v: 0 <= v < 1, "in [0, 1)")
