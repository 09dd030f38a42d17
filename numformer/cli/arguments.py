"""Argument parsing for the command lines: a usage error is one line, and the number types say their range."""
from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``prog: error: ... (see prog --help)``), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
