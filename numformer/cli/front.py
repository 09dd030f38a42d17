"""The one front of every command line: ``@command_line(PROG)`` on a command's ``main(argv)``.

Every command a user runs (train.py, translate.py, ``python -m numformer.checkpoint``, ``numformer.studies``,
``numformer.prepare``, ``numformer.data.bible``, ``numformer.data.messages``, ``numformer.plot``,
``numformer.attention_maps``, ``grad_checks``, the benches in bench/) ends the same way, because its whole
``main``, argument parsing included, runs inside :func:`numformer.cli.one_line_errors.one_line_errors`:

* a bad flag: one line ``prog: error: ... (see prog --help)``, exit 2 (:class:`OneLineParser`, which
  :func:`parser` returns; its sub-commands inherit it);
* a user's mistake (a :class:`~numformer.errors.NumformerError` raised where the bad file or setting was
  read): one line saying what is wrong and what to do, the error's exit status;
* anything else is a bug of numformer's: one line saying so and naming the file its traceback went to,
  exit 1;
* every input that is not a flag is checked as the command starts, inside the same errors: the
  environment's numformer variables (:func:`numformer.environment.check_all`: one line naming the variable,
  its value and the values it takes) and the standard streams
  (:mod:`numformer.cli.standard_streams`: closed, unable to encode a character, read by a process that has
  gone);
* SIGTERM and SIGHUP are handled as Ctrl-C is (:mod:`numformer.stop_signals`): one line, what was half
  written removed, exit 143 or 129 (130 for Ctrl-C);
* NumPy's floating-point warnings (``overflow encountered in multiply``...) never reach the user: what they
  would say is said by the command where it matters (a non-finite training step is counted, and a run of them
  is training's one exit-3 line), so they are switched off for the command (``np.errstate(all="ignore")``).

A command is wrapped once, here, rather than each growing its own ``try``/``except``: a new command gets
all three by the decorator alone, and tests/cli/test_one_front.py finds every module with a
``__main__`` guard and checks it wears it.
"""
from __future__ import annotations

import functools
import sys

import numpy as np

from .. import environment
from ..stop_signals import stop_signals_as_interrupts
from .arguments import OneLineParser
from .one_line_errors import one_line_errors
from .standard_streams import check_standard_streams, streams_that_print_anything

# Set on a wrapped main: the program name its errors start with (what the front's test looks for).
FRONT_ATTRIBUTE = "numformer_front"


def command_line(prog: str):
    """Decorator: ``main(argv=None) -> int`` runs inside ``one_line_errors(prog)``.

    The wrapped function returns the exit status (0, or the code a failure exits with) rather than ending
    the process, so that tests and other commands can call it: ``sys.exit(main())`` at the module's end
    is unchanged. A ``SystemExit`` raised inside (argparse's errors and ``--help``, the one-line errors)
    becomes that return value. Standard output is flushed inside, so that a reader gone before the end
    (``| head -1``) is answered here too, not by the interpreter's last flush.
    """
    def wrap(main):
        @functools.wraps(main)
        def run(argv=None) -> int:
            try:
                with streams_that_print_anything(), stop_signals_as_interrupts(), one_line_errors(prog), \
                        np.errstate(all="ignore"):
                    check_standard_streams(prog)
                    environment.check_all()
                    status = main(argv)
                    sys.stdout.flush()
                    return status
            except SystemExit as done:
                code = done.code
                return code if isinstance(code, int) else (0 if code is None else 1)
        setattr(run, FRONT_ATTRIBUTE, prog)
        return run
    return wrap


def parser(prog: str, description: str = "", **kwargs) -> OneLineParser:
    """The argument parser of a command: a usage error is one line, exit 2 (sub-parsers are the same class)."""
    return OneLineParser(prog=prog, description=description, **kwargs)
