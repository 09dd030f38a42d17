"""Several processes on one command line: rank 0 speaks for all, and every rank leaves together.

Under ``mpirun -n K python train.py ...`` every process runs the same command. What a person sees
must be what one process would print: rank 0 alone prints (its flags' errors, its log lines), the
others stay quiet; an error every rank meets together (a bad setting found by rank 0 and relayed, a
run of non-finite steps, mpi4py missing) is one line from rank 0, and every rank exits with the same
status; an error of one rank alone aborts the whole job, since the others would wait for it forever.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import time
import traceback

from ..backend import resolve_device
from ..cli.one_line_errors import one_line_errors
from ..errors import BUG_EXIT, exit_code_of, is_collective
from .distributed import SINGLE, init_world, launched_rank

# Before MPI is running there is nothing to wait on: a rank other than 0 that fails the same way as rank 0
# waits this long before exiting, so that rank 0's one-line message is out before mpirun ends the job.
RANK0_GRACE_S = 1.0


def parse_on_rank0(parse, argv):
    """``parse(argv)``; on ranks other than 0 its messages (a bad flag, --help) are dropped: rank 0 prints them."""
    if launched_rank() == 0:
        return parse(argv)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parse(argv)
    except SystemExit:
        time.sleep(RANK0_GRACE_S)  # let rank 0 print first: mpirun ends the job at the first failed process
        raise


class Processes:
    """What :func:`processes` yields: the ``device`` asked for, the ``world`` of processes, and the
    error report of the one-line errors (set ``report.crash_folder`` once the run folder is known)."""

    def __init__(self, device, world, report):
        self.device, self.world, self.report = device, world, report


@contextlib.contextmanager
def processes(prog: str, device_flag: str | None):
    """``with processes("train.py", args.device) as procs:`` one-line errors around the block, the device
    (``--device``, else ``$NUMFORMER_DEVICE``, else cpu), the world of processes this one belongs to
    (one alone without a launcher), and how each rank leaves on an exception (:func:`leave`). Ranks
    other than 0 print nothing to standard output."""
    world = SINGLE
    with one_line_errors(prog) as report:
        try:
            device = resolve_device(device_flag)
            world = init_world(device)
            with _quiet_unless_main(world):
                yield Processes(device, world, report)
        except BaseException as exc:
            leave(world, exc, prog)
            raise


@contextlib.contextmanager
def _quiet_unless_main(world):
    if world.size == 1 or world.is_main:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def leave(world, exc: BaseException, prog: str) -> None:
    """How a rank ends on an exception, with several processes, without leaving the others waiting.

    An exception every rank raises together (marked collective) is printed by rank 0 alone, in one
    line; every rank then exits with the same status (after a barrier, so the line is out before
    mpirun ends the job). Anything else happened on this rank alone: report it here, then abort the
    whole job (MPI_Abort). One process: nothing to do here (the one-line errors print it).
    """
    rank = world.rank if world.size > 1 else launched_rank()
    if is_collective(exc):
        if world.size > 1:
            code = report(exc, prog) if world.is_main else exit_code_of(exc)
            sys.stderr.flush()
            world.barrier()
            sys.exit(code)
        if rank > 0:
            time.sleep(RANK0_GRACE_S)
            sys.exit(exit_code_of(exc))
        return  # one process (or rank 0 before MPI started): one_line_errors prints it
    if world.size == 1 or isinstance(exc, SystemExit) and exc.code in (0, None):
        return
    code = report(exc, prog)
    sys.stdout.flush()
    sys.stderr.flush()
    world.abort(code)


def report(exc: BaseException, prog: str) -> int:
    """Print ``exc`` as the command line does (one line for a user error, else the traceback); its exit status."""
    try:
        with one_line_errors(prog):
            raise exc
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else BUG_EXIT
    except BaseException:  # noqa: BLE001  (a bug: show where)
        traceback.print_exc()
        return BUG_EXIT


def wait_for_every_rank(world) -> None:
    """Several processes: stdout flushed, then a barrier (rank 0's last lines are out before any rank exits)."""
    if world.size > 1:
        sys.stdout.flush()
        world.barrier()
