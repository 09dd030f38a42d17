"""Data parallelism: the processes (ranks) that train one model together, and how they talk.

``mpirun -n K python train.py ...`` starts K processes (ranks). Every rank holds the
whole model; each optimizer step's batches are dealt out to the ranks
(:func:`numformer.training.data_parallel.shard_batches`), every rank runs forward and backward on
its share, the gradients are summed across ranks (one collective call on one flat buffer,
:class:`numformer.training.data_parallel.GradientBucket`), and every rank applies the same Adam update to the same
summed gradient, so the replicas stay identical without ever sending weights.

Transport, chosen from the device:

* CPU ranks: MPI through ``mpi4py``: ``Allreduce(IN_PLACE, buffer, SUM)``.
* GPU ranks: NCCL through ``cupy.cuda.nccl``, one GPU per rank (the rank's index
  among the ranks of its host); the NCCL unique id is made on rank 0 and sent to the
  others over MPI, which also carries the small host-side messages (start-up
  broadcasts, the per-step stop/clock agreement).

Without a launcher (or with one rank) :func:`init_world` returns :data:`SINGLE`, a
:class:`World` whose collectives are identities, and ``mpi4py`` is never imported:
it is an optional extra (``pip install 'numformer[mpi]'``).

Errors: a user mistake (mpi4py missing, more ranks than GPUs) is a
:class:`DistributedError` (a NumformerError: the CLIs print it as one line). Work that
only rank 0 does (reading the run folder, loading a checkpoint) goes through
:meth:`World.on_main`: if it raises, rank 0 re-raises the exception and every other
rank raises :class:`RelayedError`, so all ranks stop together and only rank 0 talks.
"""
from __future__ import annotations

import time

import numpy as np

from .. import environment
from ..backend import is_cupy_array, to_host
from ..errors import NumformerError, exit_code_of, first_line, mark_collective


class DistributedError(NumformerError, ValueError):
    """A multi-process launch that cannot work as set up; the message is one line saying what to do."""


class RelayedError(RuntimeError):
    """Raised on ranks other than 0 when work done by rank 0 failed; rank 0 reports the error itself.

    ``exit_code`` is the status rank 0 exits with, so every rank ends the same way.
    """

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
        self.collective = True


def launched_size() -> int | None:
    """Number of processes the MPI launcher started (from its environment), None when it does not say."""
    return environment.launched_size()


def launched_rank() -> int:
    """This process's rank according to the launcher's environment (0 without a launcher).

    Read before MPI starts, so that rank 0 alone prints even the errors that come first
    (a bad flag, mpi4py missing).
    """
    return environment.launched_rank() or 0


class World:
    """The processes that train one model together; this base class is the single-process world.

    Attributes: ``rank`` (0..size-1), ``size``, ``local_rank`` (index among the ranks on this
    host), ``device`` ('cpu' or 'cuda:N', the device this rank computes on), ``transport``
    ('none', 'mpi' or 'nccl'). Every collective here is the identity, at the cost of a call.
    """

    rank = 0
    size = 1
    local_rank = 0
    transport = "none"

    device = "cpu"

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reads and writes the run folder, logs and draws progress bars."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        """Whether training goes through the data-parallel path (a transport, even with one rank: the
        GPU tests run that path on a one-rank NCCL world)."""
        return self.transport != "none"

    def allreduce_sum_(self, buf):
        """Sum the 1-D array ``buf`` (numpy or cupy) over all ranks, in place; returns ``buf``."""
        return buf

    def allreduce_scalars(self, values) -> np.ndarray:
        """Sum a few host numbers over all ranks: float64 array of ``len(values)``."""
        return np.asarray(values, dtype=np.float64)

    def broadcast_(self, array):
        """Overwrite ``array`` (numpy or cupy, contiguous) with rank 0's copy; returns it."""
        return array

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` (any picklable value) on every rank."""
        return obj

    def on_main(self, fn, *args, **kwargs):
        """Run ``fn`` on rank 0 only; its result there, None elsewhere.

        If ``fn`` raises, rank 0 re-raises it (marked collective) and every other rank raises
        :class:`RelayedError` with rank 0's exit status, so no rank waits for a rank that is gone.
        """
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            raise mark_collective(exc)

    def barrier(self) -> None:
        """Wait until every rank arrives here."""

    def abort(self, code: int) -> None:
        """End every rank now (after a failure only this rank knows about)."""
        raise SystemExit(code)


SINGLE = World()


class MPIWorld(World):
    """Ranks that talk through MPI (mpi4py): CPU training, and the host-side messages of GPU training."""

    transport = "mpi"

    def __init__(self, comm, mpi, device: str = "cpu"):
        self.device = device
        self.comm, self.mpi = comm, mpi
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)  # the ranks on this host
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        self.node = node

    def allreduce_sum_(self, buf):
        if is_cupy_array(buf):  # GPU arrays without NCCL: through the host (start-up only; NCCLWorld overrides)
            host = to_host(buf)  # .get(): a fresh host copy
            self.comm.Allreduce(self.mpi.IN_PLACE, host, op=self.mpi.SUM)
            buf.set(host)
            return buf
        self.comm.Allreduce(self.mpi.IN_PLACE, buf, op=self.mpi.SUM)
        return buf

    def allreduce_scalars(self, values) -> np.ndarray:
        out = np.array(values, dtype=np.float64)
        self.comm.Allreduce(self.mpi.IN_PLACE, out, op=self.mpi.SUM)
        return out

    def broadcast_(self, array):
        if is_cupy_array(array):
            # Broadcasts happen at start-up and on --resume only: staging through the host keeps the
            # GPU-specific surface to the one hot-loop call (allreduce) and works on any MPI.
            host = to_host(array)
            self.comm.Bcast(host, root=0)
            array.set(host)
            return array
        self.comm.Bcast(array, root=0)
        return array

    def broadcast_object(self, obj):
        return self.comm.bcast(obj, root=0)

    def on_main(self, fn, *args, **kwargs):
        result, failure = None, None
        if self.is_main:
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 (relayed to every rank, then re-raised)
                failure = exc
        self.barrier()  # the others wait here without spinning while rank 0 works
        news = None
        if failure is not None:
            news = (first_line(failure), exit_code_of(failure))
        news = self.broadcast_object(news)
        if news is None:
            return result
        if self.is_main:
            raise mark_collective(failure)
        raise RelayedError(*news)

    def barrier(self) -> None:
        # A non-blocking barrier polled with short sleeps: a blocking MPI barrier spins at 100% CPU,
        # which would take a core from rank 0 while it validates or decodes the test set.
        request = self.comm.Ibarrier()
        while not request.Test():
            time.sleep(0.002)

    def abort(self, code: int) -> None:
        self.comm.Abort(int(code) or 1)


class NCCLWorld(MPIWorld):
    """GPU ranks: gradients are summed by NCCL on the device; MPI carries the small host messages."""

    transport = "nccl"

    def __init__(self, comm, mpi, device: str, cupy, nccl):
        super().__init__(comm, mpi, device)
        self._cupy, self._nccl = cupy, nccl
        self._nccl_dtypes = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}
        uid = nccl.get_unique_id() if self.is_main else None
        uid = self.broadcast_object(uid)
        self.nccl_comm = nccl.NcclCommunicator(self.size, uid, self.rank)

    def allreduce_sum_(self, buf):
        if not is_cupy_array(buf):
            return super().allreduce_sum_(buf)
        # Enqueued on the current stream after the backward kernels that wrote ``buf``, and before
        # whatever reads it next: no host synchronisation here.
        stream = self._cupy.cuda.get_current_stream()
        self.nccl_comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, self._nccl_dtypes[np.dtype(buf.dtype)],
                                 self._nccl.NCCL_SUM, stream.ptr)
        return buf


_world = None  # the process's world, once MPI is started (MPI starts once per process)


def init_world(device: str = "cpu") -> World:
    """The world this process belongs to; ``device`` is 'cpu', 'cuda' or 'cuda:N'.

    Without an MPI launcher, or with one process: :data:`SINGLE`, and mpi4py is not imported.
    Under ``mpirun -n K`` with K > 1: an :class:`MPIWorld` for 'cpu', an :class:`NCCLWorld`
    for 'cuda' (each rank takes the GPU of its index among the ranks of its host, or the one
    GPU it sees when the launcher gave each rank its own); ``world.device`` is then the
    device this rank computes on. Raises DistributedError (one line) when mpi4py is
    missing, when 'cuda:N' names one GPU for several ranks, or when ranks would share a GPU.
    """
    global _world
    if _world is not None:
        return _world
    size = launched_size()
    if size is not None and size <= 1:
        return SINGLE
    if size is None:
        launcher = environment.under_launcher()
        # No launcher: one process. A launcher that names a rank but no size (srun, PMIx-only
        # launchers): several processes for sure if this is not rank 0; rank 0 without mpi4py
        # is taken for a lone process.
        if not launcher or (launched_rank() == 0 and not _mpi4py_importable()):
            return SINGLE
    try:
        import mpi4py  # noqa: PLC0415  (optional extra, imported only under a launcher)

        mpi4py.rc.thread_level = "funneled"  # only the main thread calls MPI
        from mpi4py import MPI  # noqa: PLC0415
    except ImportError:
        raise mark_collective(DistributedError(
            f"started by an MPI launcher with {size or 'several'} processes but mpi4py is not installed: "
            "pip install mpi4py (or pip install 'numformer[mpi]'), or run without mpirun")) from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        return SINGLE
    if device == "cpu":
        _world = MPIWorld(comm, MPI, "cpu")
        return _world
    ranks = MPIWorld(comm, MPI, "cpu")  # rank numbers first, to pick this rank's GPU
    device = _pick_gpu(ranks, device)
    try:
        from cupy.cuda import nccl  # noqa: PLC0415

        if not getattr(nccl, "available", True):
            raise ImportError
    except ImportError:
        raise mark_collective(DistributedError(
            "several GPU processes need NCCL, which cupy cannot find: python -m cupyx.tools.install_library "
            "--cuda 12.x --library nccl, or train on one GPU without mpirun")) from None
    import cupy  # noqa: PLC0415

    _world = NCCLWorld(comm, MPI, device, cupy, nccl)
    return _world


def _mpi4py_importable() -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec("mpi4py") is not None


def _pick_gpu(world: MPIWorld, device: str) -> str:
    """'cuda:N' for this rank: N = its index among its host's ranks (or 0 when it sees one GPU).

    Every rank sends its host, GPU count and chosen GPU to every other, so all of them refuse
    together (one line from rank 0) a host with more ranks than GPUs or two ranks on one GPU.
    """
    from ..backend import import_cupy, xp_for  # noqa: PLC0415

    if device != "cuda":
        raise mark_collective(DistributedError(
            f"--device {device} names one GPU for {world.size} processes: use --device cuda (each process takes "
            "its own GPU; set CUDA_VISIBLE_DEVICES to choose which)"))
    cupy = import_cupy()
    count = cupy.cuda.runtime.getDeviceCount()
    index = world.local_rank if count > 1 else 0
    bus = cupy.cuda.Device(index).pci_bus_id if index < count else None
    host = world.mpi.Get_processor_name()
    seen = world.comm.allgather((host, world.local_size, count, bus))
    for h, local_size, n, b in seen:
        if b is None:
            raise mark_collective(DistributedError(
                f"{local_size} processes on {h} but only {n} GPUs there: start at most one process per GPU "
                "(slots= in the host file, or mpirun --map-by ppr:N:node)"))
    gpus = [(h, b) for h, _, _, b in seen]
    if len(set(gpus)) != len(gpus):
        raise mark_collective(DistributedError(
            "several processes would share one GPU: start one process per GPU (and let each see its own, or all)"))
    xp_for(f"cuda:{index}")
    return f"cuda:{index}"
