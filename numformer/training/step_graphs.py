"""The training step as one CUDA graph per batch shape (issue 60, item 3): the host leaves the loop.

On a GPU, numformer's step is a few thousand kernel launches, each issued by Python: the host needs 130-228 ms
to issue a base step (docs/gpu.md), longer than the device needs to run it in TF32 or fp16. A CUDA graph
records the launches of one step once (cupy's stream capture) and replays them with one call. What a replay
may not do, and how this module keeps to it:

* **Static shapes.** A graph replays the shapes it saw. Token batching makes many shapes, so a batch is padded
  to a bucket (rows and time steps rounded up to :data:`BUCKET`): padding is exact in the gradient (a pad target
  has loss weight 0, pad keys are masked); how many shapes are kept is a matter of memory (below). The batch is
  copied into the bucket's own device arrays before each replay.
* **No host values baked in.** What changes from step to step lives in device memory written before the replay:
  the token count the loss divides by, Adam's ``step_size`` and ``bc2_sqrt``
  (:func:`numformer.kernels.adam.step_scalars`). Dropout's masks come from a counter the device advances
  (:class:`numformer.backend.RandomState` on the GPU), so a replay draws new masks. The fp16 loss scale is a
  host number the graph bakes in: a graph is kept per (shape, scale), and the scale changes rarely. With fp16
  GEMMs the weights' float16 copies (:func:`numformer.precision.half_weights`) are made inside the graph, so
  each replay copies the weights Adam just updated.
* **No host decision inside.** A non-finite loss or gradient norm drops the update on the device
  (:func:`numformer.kernels.adam.grad_norm_cuda`'s flag, read by the fused Adam), and the host, reading the loss
  and norm after the replay as it does after every step, counts the step or not exactly as the uncaptured
  step does.
* **GEMMs on a cuBLAS handle of numformer's own.** CuPy refuses every cuBLAS call while a stream captures
  (``cupy_backends/cuda/libs/cublas.pyx``'s ``setStream``), so ``@`` cannot be captured: inside the body every
  product goes to :class:`numformer.kernels.gemm.Handle` (:func:`numformer.backend.product`), a handle with a
  workspace of its own, bound to the capture stream before the capture begins (the attention kernels carry the
  batched products there: a capture needs them allowed to run).
* **Memory that fits.** Every graph is captured on one stream (:attr:`StepGraphs.stream`) and allocates from one
  memory pool of the graphs' own: CuPy keeps a free list per stream, so the scratch one graph freed at the end of
  its capture is what the next capture reuses (a stream per graph would pin a whole step's scratch each, 15-19 GB
  at base); the graphs replay one after another on that stream, so sharing it is safe. The pool is capped in
  bytes (:data:`GRAPH_MEMORY_FRACTION` of the device's memory), not in shapes. A capture that does not fit drops
  every graph, then frees the pool's blocks (no graph is left to replay into them) and captures again; the pool's
  allocator turns CUDA's out-of-memory error into :class:`GraphMemoryFull`, since CuPy answers that error by
  freeing every free block of the pool (``cupy/cuda/memory.pyx``, ``_try_malloc``), the very blocks live graphs
  replay into. A shape is captured on its second sighting, after an uncaptured step has compiled every kernel it
  launches.

When the step cannot be captured (not a GPU, hooks that run host code between the passes: several
processes, per-batch dropout seeds, gradient statistics; the fused Adam and norm kernels not allowed to run; a
capture that fails), the step runs uncaptured and the reason is said once. On the CPU the same body runs
without a capture (``rehearse``): the tests check the padding, the device scalars and the device's verdict
there, with the CUDA kernels on the host emulator; on the tests' CuPy stand-in the capture itself is modelled
(what CuPy refuses while a stream captures is refused there, a graph replays its records on the same memory:
tests/training/test_step_graphs.py); the real capture needs a GPU (tests/device/test_step_graphs_on_gpu.py).
"""
from __future__ import annotations

import collections
import contextlib
import math

import numpy as np

from ..backend import get_array_module, import_cupy, is_cupy_array, read_scalars
from ..errors import NumformerError
from ..kernels import adam as adam_kernels
from ..kernels import attention as _attention_kernels  # noqa: F401  (registers the attention CUDA source)
from ..kernels import gemm
from ..kernels.cuda_sources import may_run
from ..optim import scale_to_norm
from ..precision import get_matmul_precision, half_weights
from .step_hooks import StepResult, StepStatus, finite_status

BUCKET = 8                   # rows and time steps rounded up to a multiple of this: few shapes, little padding
GRAPH_MEMORY_FRACTION = 0.5  # the graphs' memory pool holds at most this share of the device's memory
CUDA_OUT_OF_MEMORY = 2       # cudaErrorMemoryAllocation


class GraphMemoryFull(NumformerError, MemoryError):
    """The device had no memory left for the graphs' pool (raised in place of CUDA's error, which CuPy's pool would
    answer by freeing the blocks live graphs replay into)."""


def _malloc_or_full(cupy):
    """A ``cudaMalloc`` for the graphs' pool (what CuPy's own allocator does, ``cupy/cuda/memory.pyx``'s ``_malloc``:
    ``MemoryPointer(Memory(size), 0)``, through CuPy's public names), CUDA's out-of-memory error raised as
    :class:`GraphMemoryFull`."""
    cuda_error = cupy.cuda.runtime.CUDARuntimeError

    def malloc(size):
        try:
            return cupy.cuda.MemoryPointer(cupy.cuda.Memory(size), 0)
        except cuda_error as exc:
            if getattr(exc, "status", None) == CUDA_OUT_OF_MEMORY:
                raise GraphMemoryFull(f"no device memory left for {size} bytes of the step graphs") from None
            raise
    return malloc


def bucketed(n: int) -> int:
    return -(-int(n) // BUCKET) * BUCKET


def padded(a, rows: int, cols: int, pad_id: int) -> np.ndarray:
    """Host int array ``a`` (r, c) in the top-left corner of a (rows, cols) array of ``pad_id``."""
    out = np.full((rows, cols), pad_id, dtype=np.asarray(a).dtype)
    out[:a.shape[0], :a.shape[1]] = a
    return out


class CapturedStep:
    """One bucket's device inputs, device scalars, captured graph (None: not yet, or rehearsed) and outputs."""

    def __init__(self, trainer, shapes, scale):
        xp, buffer = trainer.xp, trainer.optimizer.buffer
        self.trainer, self.shapes, self.scale = trainer, shapes, scale
        self.inputs = [tuple(xp.zeros(s, dtype=np.int64) for s in shape) for shape in shapes]
        self.normalizer = xp.zeros((), dtype=np.float32)
        self.scalars = {d.dtype.name: adam_kernels.step_scalars(xp, d.dtype.type, 0.0, 1.0) for d in buffer.data}
        self.nonfinite = xp.zeros(1, dtype=np.int32)
        self.graph = None
        self.uncapturable = False  # too big for the graphs' memory: runs uncaptured
        self.loss = self.nll = self.gnorm = None
        self.sightings = 0

    def load(self, batches, n_tokens: int, t: int) -> None:
        """Write this step's batches (padded), token count and Adam scalars into the device arrays."""
        tr = self.trainer
        pad = tr.model.cfg.pad_id
        for (src, tgt_in, tgt_out), b in zip(self.inputs, batches):
            for target, a in ((src, b.src), (tgt_in, b.tgt_in), (tgt_out, b.tgt_out)):
                target[...] = tr.xp.asarray(padded(a, *target.shape, pad))
        self.normalizer[...] = n_tokens
        opt = tr.optimizer
        step_size = opt.schedule(t) / (1.0 - opt.beta1 ** t)
        bc2_sqrt = math.sqrt(1.0 - opt.beta2 ** t)
        for array in self.scalars.values():
            adam_kernels.write_step_scalars(array, step_size, bc2_sqrt)

    def body(self, bound: bool = False) -> None:
        """Forward, loss, backward, norm and Adam, from the device arrays alone (what is captured); ``bound``: the
        GEMM handle is already bound to the stream (a capture binds it before it begins)."""
        tr = self.trainer
        xp, model, crit, hooks, opt = tr.xp, tr.model, tr.criterion, tr.hooks, tr.optimizer
        buffer = opt.buffer
        loss = nll = xp.zeros((), dtype=np.float32)
        # fp16: the weights' float16 copies made in the graph, once a replay; every product on numformer's handle
        with half_weights(buffer), tr.step_graphs.gemms(bind=not bound):
            for src, tgt_in, tgt_out in self.inputs:
                logits = model(src, tgt_in)
                loss = loss + crit.forward(logits, tgt_out, normalizer=self.normalizer, overwrite_logits=True)
                nll = nll + crit.nll_sum
                model.backward(hooks.seed_backward(crit.backward()))
        loss, nll = hooks.after_backward(loss, nll)
        gnorm = adam_kernels.grad_norm_cuda(buffer.grads, nonfinite=self.nonfinite)
        self.nonfinite |= (~xp.isfinite(loss)).astype(np.int32)  # the host's finite check, made on the device
        if tr.cfg.clip_norm > 0:
            scale_to_norm(buffer.grads, gnorm, tr.cfg.clip_norm)
        adam_kernels.adam_update_cuda(buffer.data, buffer.grads, opt.m_flat, opt.v_flat, 0.0, opt.beta1, opt.beta2,
                                      1.0, opt.eps, zero_grad=True, scalars=self.scalars, skip=self.nonfinite)
        self.loss, self.nll, self.gnorm = loss, nll, gnorm

    def capture(self) -> None:
        """Record :meth:`body` as a CUDA graph on the graphs' one stream, allocating from their pool, the GEMM handle
        bound to that stream before the capture begins (raises what the body or the capture raised)."""
        cupy = import_cupy()
        graphs = self.trainer.step_graphs
        handle, stream = graphs.handle(), graphs.stream
        with cupy.cuda.using_allocator(graphs.pool.malloc), stream:
            handle.bind(stream.ptr)
            stream.begin_capture()
            try:
                self.body(bound=True)
            except BaseException:
                with contextlib.suppress(Exception):  # a capture the body's error invalidated: the body's error says why
                    stream.end_capture()
                raise
            graph = stream.end_capture()
        self.graph = graph

    def run(self) -> None:
        """Replay the graph on the graphs' stream (its work waits for what the current stream queued: the inputs just
        written; the current stream's later work waits for it)."""
        if self.graph is None:
            self.body()
            return
        cupy = import_cupy()
        stream = self.trainer.step_graphs.stream
        current = cupy.cuda.get_current_stream()
        stream.wait_event(current.record())
        self.graph.launch(stream=stream)
        current.wait_event(stream.record())


class StepGraphs:
    """The captured steps of a :class:`~numformer.training.trainer.Trainer`, by batch shape and loss scale, their
    one capture stream, memory pool and GEMM handle."""

    def __init__(self, trainer, rehearse: bool = False):
        self.trainer, self.rehearse = trainer, rehearse
        self.steps = {}
        self.seen = collections.Counter()  # sightings per key (kept when graphs are dropped to make room)
        self.said = set()
        self.pool = self.stream = None
        self.memory_cap = 0
        self.room_made = 0  # how often every graph was dropped for a capture that did not fit
        self._handle = None
        self.broken = None  # why a capture failed: every later step runs uncaptured
        if not rehearse and is_cupy_array(trainer.optimizer.buffer.data[0]):
            cupy = import_cupy()
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.pool = cupy.cuda.MemoryPool(_malloc_or_full(cupy))
            self.memory_cap = int(GRAPH_MEMORY_FRACTION * cupy.cuda.runtime.memGetInfo()[1])
            self.pool.set_limit(size=self.memory_cap)

    def handle(self) -> gemm.Handle:
        """The GEMM handle of the captured steps (made at the first call, outside any capture)."""
        if self._handle is None:
            self._handle = gemm.Handle(get_array_module(self.trainer.optimizer.buffer.data[0]))
        return self._handle

    @contextlib.contextmanager
    def gemms(self, bind: bool = True):
        """Inside: device products on :meth:`handle` (bound to the current stream when ``bind``); host arrays: ``@``."""
        if not is_cupy_array(self.trainer.optimizer.buffer.data[0]):
            yield
            return
        handle = self.handle()
        if bind:
            handle.bind(import_cupy().cuda.get_current_stream().ptr)
        with gemm.owned_gemms(handle, tf32=get_matmul_precision() == "tf32"):
            yield

    def why_not(self) -> str | None:
        """Why this trainer's step cannot be captured, or None."""
        tr = self.trainer
        if self.broken is not None:
            return self.broken
        if not self.rehearse and not is_cupy_array(tr.optimizer.buffer.data[0]):
            return "CUDA graphs need --device cuda"
        if tr.world.parallel or tr.grad_stats is not None or tr.batch_seeded:
            return "several processes, per-batch dropout seeds and gradient statistics run host code inside the step"
        if not self.rehearse and not (may_run("adam") and may_run("attention")):
            return ("the fused Adam, norm and attention kernels (the attention's batched GEMMs on numformer's cuBLAS "
                    "handle) have no GPU proof at their sources yet (NUMFORMER_CUDA_UNPROVEN=1 opts in)")
        if not self.rehearse and tr.model.cfg.dropout > 0 and tr.model.rng.counter is None:
            return "dropout's generator advances on the host: a replay would repeat its masks"
        return None

    def say_once(self, why: str) -> None:
        if why not in self.said:
            self.said.add(why)
            self.trainer.log(f"the step runs uncaptured: {why}")

    def memory_bytes(self) -> int:
        """The bytes the graphs' pool holds (0 when rehearsed)."""
        return 0 if self.pool is None else int(self.pool.total_bytes())

    def make_room(self, keep) -> None:
        """Drop every graph but ``keep``'s, then free the pool's blocks: no live graph replays into them any more."""
        for key in [k for k, s in self.steps.items() if s is not keep]:
            del self.steps[key]
        keep.graph = None
        self.pool.free_all_blocks()
        self.room_made += 1

    def _capture(self, step) -> bool:
        """Capture ``step``; one that does not fit makes room and tries once more. False: it runs uncaptured."""
        cupy = import_cupy()
        full = (cupy.cuda.memory.OutOfMemoryError, GraphMemoryFull)
        for attempt in (1, 2):
            try:
                step.capture()
                return True
            except full as exc:
                if attempt == 1:
                    self.make_room(step)
                    continue
                self.say_once(f"a step of shape {step.shapes} does not fit in the graphs' memory "
                              f"({self.memory_cap} bytes): it runs uncaptured ({type(exc).__name__})")
                step.graph, step.uncapturable = None, True
                return False
            except Exception as exc:  # noqa: BLE001  (any capture failure: the step runs uncaptured)
                self.broken = (f"the capture failed ({type(exc).__name__}: "
                               f"{(str(exc) or '-').splitlines()[0][:200]})")
                self.say_once(self.broken)
                self.steps.clear()
                return False
        return False

    def step(self, batches, n_tokens: int):
        """Run one optimizer step captured (or rehearsed): (loss, nll, gnorm) as device 0-d arrays, or None
        when it must run uncaptured (the reason said once)."""
        why = self.why_not()
        if why is not None:
            self.say_once(why)
            return None
        tr = self.trainer
        mine = [batches[i] for i in tr.my_share(batches)]
        shapes = tuple(((bucketed(b.src.shape[0]), bucketed(b.src.shape[1])),
                        (bucketed(b.tgt_in.shape[0]), bucketed(b.tgt_in.shape[1])),
                        (bucketed(b.tgt_out.shape[0]), bucketed(b.tgt_out.shape[1]))) for b in mine)
        scale = None if tr.scaler is None else tr.scaler.scale
        key = (shapes, scale)
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = CapturedStep(tr, shapes, scale)
        self.seen[key] += 1
        step.sightings = self.seen[key]
        step.load(mine, n_tokens, tr.optimizer.step_count + 1)
        if self.rehearse or step.graph is not None or step.uncapturable:
            step.run()
        elif step.sightings == 1:
            step.body()  # first sighting: uncaptured, compiling every kernel the capture will record
        elif self._capture(step):
            step.run()
        elif self.broken is not None:
            return None
        else:
            step.body()
        return step.loss, step.nll, step.gnorm

    def judge(self, captured, n_tokens: int) -> StepResult:
        """The host's half of a captured step: read loss and norm (the step's one sync) and judge the step as the
        uncaptured one does (the hooks' verdict, else the finite check); the device already dropped the update
        of a non-finite step and zeroed the gradients either way, so an OK step only counts."""
        tr = self.trainer
        loss, nll, gnorm = captured
        loss, gnorm = read_scalars(tr.xp, loss, gnorm)
        status = tr.hooks.verdict(loss, gnorm) or finite_status(loss, gnorm)
        if status is StepStatus.OK:
            tr.hooks.before_update(tr.optimizer.step_count + 1)
            tr.optimizer.step_count += 1  # the update ran on the device, with this step's scalars
            tr.hooks.after_update(tr.optimizer.step_count)
        return StepResult(loss, nll, n_tokens, gnorm, status)
