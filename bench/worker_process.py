"""The benches' child processes: run one, and when it fails pass its own last line on.

The benches time each side in a fresh process (so peak memory and thread pools are its own). A worker is the
same script with ``--worker``, wearing the same front (numformer/cli/front.py), so when it fails its last line
on stderr already says what happened: a user's mistake (``prog: error: ...``) or a bug of numformer's with the
file its traceback went to (``prog: internal error (a bug in numformer ...): ...; the traceback is in PATH``).
The parent passes that line on as its own one-line error, with the worker's exit status, instead of
printing the worker's whole stderr or a traceback of its own; a worker killed by a signal says which.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from numformer.errors import NumformerError


class WorkerFailed(NumformerError):
    """A worker process ended with an error; the message is its own last line, the exit status its own (1 for a
    bug the worker reported, 2 for a user's mistake, 128 + N after signal N)."""

    def __init__(self, what: str, returncode: int, stderr: str):
        lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
        if returncode < 0:
            said = f"killed by {_signal_name(-returncode)}" + (f" after: {lines[-1]}" if lines else "")
            code = 128 - returncode
        else:
            said = lines[-1] if lines else f"exit status {returncode} and nothing on stderr"
            code = returncode
        super().__init__(f"the {what} failed: {said}")
        self.exit_code = code


def _signal_name(number: int) -> str:
    """SIGKILL for 9; the number itself for one the signal module does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def side_result(script, side: str, shape: dict, args, root) -> dict:
    """One side of a bench run in a child of its own: ``script --worker SIDE --shape JSON`` with ``args``' steps,
    warm-up and threads (the BLAS and OpenMP thread variables set to them), in ``root``; -> the JSON object of its
    last line of output."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    cmd = [sys.executable, str(script), "--worker", side, "--shape", json.dumps(shape), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads)]
    proc = run_worker(cmd, f"{side} worker", env=env, cwd=root)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(cmd, what: str, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``; raises :class:`WorkerFailed` (one line:
    the worker's own last line) when it does not exit 0."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise WorkerFailed(what, proc.returncode, proc.stderr)
    return proc
