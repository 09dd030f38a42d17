"""Replica bookkeeping: what the processes training one model agree on, besides the gradient sum.

With several processes (:mod:`numformer.training.distributed`), every rank holds a replica of the model, and
identical updates of identical summed gradients keep the replicas identical. What keeps them
identical around that:

* :func:`share_run`: rank 0 alone reads the run folder and the corpus; the others get its settings,
  vocabulary and training ids (:class:`~numformer.data.prepared_dataset.PreparedData`), so no other host needs the data;
* :func:`sync_replicas`: when training starts, every rank takes rank 0's weights, frozen buffers (a
  logits bias), Adam moments and progress (step, data position, clock, counters), also after a
  ``--resume`` only rank 0 read;
* :class:`StopRequests`: SIGINT, SIGTERM and SIGHUP (and SIGUSR1, which ``mpirun`` forwards to every rank)
  ask training to stop after the current step; after each step the ranks agree on rank 0's clock and
  on whether any rank was asked to stop, so ``--max-minutes``, saving by time and signals end or save
  the same step everywhere (:meth:`StopRequests.agree`, one small message per step).

With one process all of this is free: nothing is sent, and a signal stops training after the step.
"""
from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..stop_signals import STOP_SIGNALS, ignored_from_start, stopped
from .data_parallel import broadcast_arrays_

if TYPE_CHECKING:
    from ..data.prepared_dataset import PreparedData
    from ..presets import ModelConfig
    from .config import RunSettings


class SharedRun(NamedTuple):
    """What every rank trains from (:func:`share_run`): the run's settings, the model's, the prepared data."""

    run: RunSettings
    model_config: ModelConfig
    data: PreparedData


def sync_replicas(world, optimizer, progress: dict, buffers=()) -> dict:
    """Every rank takes rank 0's weights, Adam moments and ``buffers`` (the model's persistent buffers,
    ``model.named_buffers(persistent_only=True)``'s arrays: frozen, so no update keeps them equal, only
    this) in place, and gets rank 0's ``progress`` (a picklable dict: step, data position, clock,
    counters), which it returns. One process: as given."""
    if not world.parallel:
        return progress
    for flat in optimizer.buffer.data + optimizer.m_flat + optimizer.v_flat:  # whole buffers: one call each
        world.broadcast_(flat)
    broadcast_arrays_(world, list(buffers))
    return world.broadcast_object(progress)


class StopRequests:
    """Signals that ask training to stop after the current step, and their agreement across ranks.

    ``with StopRequests(world) as stop:`` installs the handlers (in the main thread only, where
    Python delivers signals) and restores the previous ones after. ``stop.requested`` turns true after
    a SIGINT, SIGTERM or SIGHUP with one process; with several, a signal seen by one rank is acted on at
    :meth:`agree`, once every rank knows. ``stop.signum``: the first signal received (its exit status:
    :func:`numformer.stop_signals.exit_status`, 143 for a scheduler's SIGTERM). A second signal stops at
    once (KeyboardInterrupt, :class:`numformer.errors.Stopped` for SIGTERM and SIGHUP), a save in progress
    included: its temporary is removed, the checkpoints before it stay.
    """

    def __init__(self, world):
        self.world = world
        self.requested = False
        self.signum = None       # the first signal received here
        self._seen = False       # a signal this rank received (several ranks: not acted on before agree)
        self._previous = {}

    def __enter__(self) -> "StopRequests":
        # mpirun ends the job on SIGINT/SIGTERM (SIGKILL a second later) but forwards SIGUSR1 to every
        # rank: with several ranks, SIGUSR1 is the graceful stop. A signal ignored from the start (nohup's
        # SIGHUP) stays ignored.
        handled = (signal.SIGINT, *STOP_SIGNALS) + ((signal.SIGUSR1,) if self.world.parallel else ())
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in handled
                              if not ignored_from_start(sig)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if (self.requested or self._seen) and (signum == signal.SIGINT or signum in STOP_SIGNALS):  # a second: now
            raise stopped(signum)
        self.signum = signum
        if self.world.parallel:
            self._seen = True
        else:
            self.requested = True

    def agree(self, elapsed: float) -> float:
        """After a step (several ranks): a stop asked of any rank becomes everyone's, and rank 0's
        clock becomes every rank's; returns that clock. One process: ``elapsed`` as it is."""
        if not self.world.parallel:
            return elapsed
        main = self.world.is_main
        summed = self.world.allreduce_scalars([1.0 if self._seen else 0.0, elapsed if main else 0.0])
        self.requested = self.requested or bool(summed[0] > 0)
        return float(summed[1])


def share_run(world, settled: SharedRun | None) -> SharedRun:
    """Rank 0's ``settled`` on every rank (the other ranks pass None).

    The other ranks never read the run folder or the corpus: they get the settings and the vocabulary
    over MPI and memory-map the dataset rank 0 prepared (one copy of its pages per host); a rank that
    cannot see the same files (another host without a shared file system) gets the arrays from rank 0.
    """
    from dataclasses import asdict  # noqa: PLC0415

    from ..data import TokenPairs  # noqa: PLC0415
    from ..data.marian_vocab import vocab_from_bytes  # noqa: PLC0415
    from ..data.prepared_dataset import PreparedData, manifest_digest, open_shared_train  # noqa: PLC0415
    from ..presets import ModelConfig  # noqa: PLC0415
    from .config import RunSettings, TrainConfig  # noqa: PLC0415

    if world.size == 1:
        return settled
    shared = None
    if world.is_main:
        run, mcfg, data = settled
        folder = data.folder.resolve() if data.folder is not None else None
        shared = dict(run=asdict(run), mcfg=mcfg.to_dict(), vocab=data.vocab.to_bytes(), source=data.source,
                      folder=folder and str(folder), manifest=manifest_digest(folder) if folder is not None else None)
    shared = world.broadcast_object(shared)
    pairs = None if world.is_main else open_shared_train(shared["folder"], shared["manifest"])
    if world.allreduce_scalars([0.0 if world.is_main or pairs is not None else 1.0])[0] > 0:
        train = settled.data.ids["train"] if world.is_main else None
        arrays = world.broadcast_object(None if train is None else tuple(
            np.asarray(a) for a in (train.src_ids, train.src_offsets, train.tgt_ids, train.tgt_offsets)))
        if pairs is None and not world.is_main:
            pairs = TokenPairs(*arrays)
    if world.is_main:
        return settled
    run = dict(shared["run"])
    run["train"] = TrainConfig(**run["train"])
    data = PreparedData(vocab_from_bytes(shared["vocab"]), {}, {"train": pairs}, shared["source"])
    return SharedRun(RunSettings(**run), ModelConfig.from_dict(shared["mcfg"]), data)
