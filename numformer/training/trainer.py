"""The training step and loop (Section 5): token batches, gradient accumulation, Adam + warmup.

One optimizer step (Section 5.3) = ``accum`` batches of up to ``max_tokens`` tokens each: forward,
label-smoothed loss (Section 5.4), backward, then clipping (off unless ``clip_norm``) and one Adam
step with the warmup schedule of Eq. 3. The loss of each batch is divided by the target-token count
of the whole step, so accumulated gradients equal those of one big batch. :meth:`Trainer.train_step`
is the step and :meth:`Trainer.train` the loop: read them top to bottom.

What a run adds to the step (dropout masks keyed by batch, the all-reduce of several processes, fp16
loss scaling, gradient statistics) hangs on it as hooks (:mod:`numformer.training.step_hooks`). What
happens around the loop lives beside it: the run folder (checkpoints written and rotated, resume
checks, metrics, averaging) in :mod:`numformer.training.run_folder`; the bookkeeping of several
processes in :mod:`numformer.training.replicas`; validation in :mod:`numformer.training.validation`;
the settings in :mod:`numformer.training.config`.

Faults: a step whose loss or gradient norm is not finite changes nothing (no Adam update), is
logged and written to metrics.jsonl; ``max_nonfinite_in_a_row`` such steps in a row stop training
with :class:`StopTraining`, without a checkpoint, so the last good one stays the newest. SIGINT
(Ctrl-C) or SIGTERM ends the current step, saves a checkpoint and returns (``interrupted``).

A checkpoint holds the weights, Adam's moments and step, the dropout RNG state, the data position
(epoch, batch) and the elapsed time, so ``--resume`` continues exactly where the run stopped: on the
CPU a resumed run is bit-identical to an uninterrupted one.

Dropout masks (``dropout_rng``): "stream" (the default with one process) draws every mask from the
model's one RandomState, whose state checkpoints keep. "batch" (forced with several processes)
reseeds it before each batch from ``(seed, epoch, position of the batch in the epoch)``
(:func:`~numformer.training.step_hooks.dropout_seed`), so a batch sees the same masks whichever
process computes it, with any number of processes and any ``accum``, and after a resume.

Several processes (``world``, see :mod:`numformer.training.distributed`): each optimizer step takes
``world.size * accum`` batches from the epoch's list (the same list on every rank), deals ``accum``
of them to each rank by token count, normalises the loss by the target tokens of all of them, and
sums gradients and loss across ranks in the one gradient buffer before the update, which is then the update one
process would make on all those batches. Rank 0 alone writes the run folder, logs and draws the
progress bar.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np

from .. import run_file_names
from ..backend import read_scalars
from ..checkpoint import CheckpointError, vocab_fingerprint
from ..errors import StopTraining, mark_collective
from ..layers.registry import layer_class
from ..optim import Adam, NoamSchedule, clip_grad_norm
from ..precision import half_weights, matmul_precision
from ..stop_signals import what_stopped
from .config import TrainConfig
from .data_parallel import GradientBucket, shard_batches
from .distributed import SINGLE
from .epochs import EpochWalk
from .forecast import StepTimeForecast
from .gradient_statistics import GradientStatistics
from .loss_scaling import DynamicLossScaler
from .metrics import LogWindow, train_record
from .progress_bar import BudgetBar
from .replicas import StopRequests, sync_replicas
from .run_folder import RunFolder
from .step_graphs import StepGraphs
from .step_hooks import (BatchDropoutKeys, GradientAllReduce, LossScaling, StepHooks, StepResult,
                         StepStatus, finite_status)
from .tensorboard_log import TensorBoardLog
from .validation import evaluate


class Trainer:
    """Trains ``model`` on ``data`` (a PreparedData) into the run folder ``out`` (a path or a
    :class:`~numformer.training.run_folder.RunFolder`; a path is locked for this process, on rank 0).

    ``world``: the processes training this model together (default: this one alone). With several,
    every rank builds a Trainer over the same model config and training ids; only rank 0 needs the
    run folder, the validation and test data.
    """

    def __init__(self, model, data, cfg: TrainConfig, out, progress: bool = True, log=print, world=None,
                 name: str = "this model"):
        self.world = world = SINGLE if world is None else world
        self.name = name            # what the expected-time line calls the model (train.py: the preset)
        self.model, self.data, self.cfg = model, data, cfg.checked(positional_table=model.cfg.max_len)
        self.folder = out if isinstance(out, RunFolder) else RunFolder(out, lock=world.is_main)
        self.log = log if world.is_main else _quiet
        self.progress = progress and world.is_main
        self.xp = model.xp
        self.criterion = layer_class("LabelSmoothedCrossEntropy")(model.cfg.label_smoothing, model.cfg.pad_id)
        self.schedule = NoamSchedule(model.cfg.d_model, cfg.warmup, cfg.lr_factor)
        self.optimizer = Adam(model.parameters(), schedule=self.schedule)
        self.vocab = data.vocab
        self._vocab_sha256 = vocab_fingerprint(data.vocab)
        self.training_batches = EpochWalk(data, cfg.max_tokens, cfg.seed, cfg.max_len, model.cfg.max_len, self.log)
        self.elapsed = 0.0          # the training clock (seconds of training steps; validation not counted)
        self.skipped_steps = 0      # non-finite steps skipped over the whole run
        self.nonfinite_in_a_row = 0
        self.window = LogWindow()   # the steps since the last log line
        self._interrupted = False
        self.stop_signal = None  # the signal that stopped training (SIGINT, SIGTERM, SIGHUP), once it has
        # fp16 GEMMs: gradients below float16's range would vanish without loss scaling (Micikevicius et al.)
        self.scaler = DynamicLossScaler() if cfg.precision == "fp16" else None
        self.tensorboard = (TensorBoardLog(self.folder.path, model, data)  # cfg.tensorboard: event files too
                            if cfg.tensorboard and world.is_main else None)
        self.grad_stats = (GradientStatistics(model, self.folder.path / run_file_names.GRAD_STATS, cfg.log_grads,
                                              self.tensorboard) if cfg.log_grads and world.is_main else None)
        # several processes: masks must not depend on which rank computes a batch
        self.batch_seeded = cfg.dropout_rng == "batch" or world.parallel
        self.hooks = StepHooks(  # in this order: the sum over processes is unscaled, not the other way round
            BatchDropoutKeys(model, cfg.seed) if self.batch_seeded else None,
            GradientAllReduce(world, GradientBucket(self.optimizer.buffer, extra=2)) if world.parallel else None,
            LossScaling(self.scaler, self.optimizer.buffer) if self.scaler is not None else None,
            self.grad_stats)
        self.step_graphs = StepGraphs(self) if cfg.cuda_graphs else None  # GPU: the step as CUDA graphs

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self.training_batches.epoch

    @property
    def batch_pos(self) -> int:
        """The position of the next batch in its epoch's plan."""
        return self.training_batches.batch_pos

    @property
    def interrupted(self) -> bool:
        """True when SIGINT or SIGTERM ended the last :meth:`train` early (a checkpoint was saved)."""
        return self._interrupted

    # -- one step ------------------------------------------------------------------------------------
    def step(self, batches, keys=None) -> StepResult:
        """One optimizer step as training runs it: replayed as a CUDA graph where it can be (``cuda_graphs``:
        :mod:`numformer.training.step_graphs`), else :meth:`train_step`; with fp16 GEMMs the weights' float16
        copies are made once for it (:func:`numformer.precision.half_weights`: the update is its last act)."""
        if self.step_graphs is not None:  # (a captured step makes its float16 copies inside the graph)
            n_tokens = sum(b.n_tgt_tokens for b in batches)
            captured = self.step_graphs.step(batches, n_tokens)
            if captured is not None:
                return self.step_graphs.judge(captured, n_tokens)
        with half_weights(self.optimizer.buffer):
            return self.train_step(batches, keys)

    def train_step(self, batches, keys=None) -> StepResult:
        """One optimizer step over ``batches`` (every process's: ``world.size * accum``; ``keys``: their
        (epoch, position), for dropout masks keyed by batch). The loss is per target token of all of
        them, so the summed gradient is that of one big batch. Loss and gradient norm come back as host
        floats, read together: the step's one device sync."""
        xp, model, crit, hooks = self.xp, self.model, self.criterion, self.hooks
        n_tokens = sum(b.n_tgt_tokens for b in batches)  # every rank knows every batch: no message needed
        mine = self.my_share(batches)
        loss = nll = 0.0
        hooks.begin(self.optimizer.step_count + 1, keys)
        for i in mine:
            b = batches[i]
            hooks.before_forward(i, last=i == mine[-1])
            logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))                              # 1. forward
            hooks.after_forward(last=i == mine[-1])
            loss = loss + crit.forward(logits, xp.asarray(b.tgt_out), normalizer=n_tokens,     # 2. loss
                                       overwrite_logits=True)
            nll = nll + crit.nll_sum
            model.backward(hooks.seed_backward(crit.backward()))                                 # 3. backward
        loss, nll = hooks.after_backward(loss, nll)
        gnorm = clip_grad_norm(self.optimizer.buffer, self.cfg.clip_norm)                        # 4. clip
        loss, gnorm = read_scalars(xp, loss, gnorm)
        status = hooks.verdict(loss, gnorm) or finite_status(loss, gnorm)
        if status is not StepStatus.OK:
            self.optimizer.zero_grad()  # the step is dropped: no Adam update, no step count
            return StepResult(loss, nll, n_tokens, gnorm, status)
        hooks.before_update(self.optimizer.step_count + 1)
        self.optimizer.step(zero_grad=True)                                                      # 5. Adam step
        hooks.after_update(self.optimizer.step_count)
        return StepResult(loss, nll, n_tokens, gnorm, status)

    def my_share(self, batches) -> list[int]:
        """The indices of the batches this process computes (all of them with one process)."""
        if self.world.size == 1:
            return list(range(len(batches)))
        return list(shard_batches([b.n_padded_tokens for b in batches], self.world.size, self.world.rank))

    # -- the loop ------------------------------------------------------------------------------------
    def train(self) -> dict:
        """Run until max_steps or max_minutes (or SIGINT/SIGTERM); returns the last metrics record.

        The GEMMs run in ``cfg.precision`` for the duration (validation during training included),
        and the previous precision is restored afterwards. Raises StopTraining after
        ``max_nonfinite_in_a_row`` non-finite steps in a row, and CheckpointError (before the first
        step) when the run folder cannot hold the checkpoints.
        """
        cfg, world = self.cfg, self.world
        world.on_main(self.folder.preflight, self.checkpoint_bytes(), cfg.keep_last)  # fails every rank
        frozen = [a for _, a in self.model.named_buffers(persistent_only=True)]  # a logits bias: never trained
        self._restore_progress(sync_replicas(world, self.optimizer, self._progress(), frozen))  # rank 0's start
        if self.tensorboard is not None:  # after a resume: events past the checkpoint's step are hidden
            self.tensorboard.open(self.optimizer.step_count)
        self.model.train()
        bar = BudgetBar(cfg.max_steps, cfg.max_minutes, self.optimizer.step_count, self.elapsed) \
            if self.progress else None
        last_save, record = self.elapsed, {}
        forecast = StepTimeForecast(self.name, "cpu" if self.xp is np else "cuda", self.optimizer.step_count,
                                    cfg.max_steps, cfg.max_minutes, cfg.accum * world.size)
        with self._numerics(), StopRequests(world) as stop, _closing_optional(bar), _closing_optional(self.tensorboard):
            while not self.done() and not stop.requested:
                t0 = time.perf_counter()
                batches, keys = self.training_batches.next_batches(cfg.accum * world.size)
                result = self.step(batches, keys)
                dt = time.perf_counter() - t0
                self.elapsed = stop.agree(self.elapsed + dt)  # several ranks: rank 0's clock, anyone's stop
                self.window.add_time(result.tokens, dt)
                if result.status is StepStatus.OVERFLOW:  # fp16: the scale halved; the next batches redo the step
                    continue
                if result.status is StepStatus.NONFINITE:
                    self._skipped(self.optimizer.step_count, result.loss, result.grad_norm)
                    continue
                step = self.optimizer.step_count
                self.nonfinite_in_a_row = 0
                expected = forecast.add(step, dt, sum(b.n_src_tokens for b in batches), result.tokens)
                if expected is not None:  # once, after the first steps: the whole budget's wall time here
                    self.log(expected)
                self.window.add_loss(result.loss)
                record = self._log(step, result.grad_norm, bar) or record
                saving = (cfg.save_every and step % cfg.save_every == 0) or (
                    cfg.save_every_minutes and self.elapsed - last_save >= 60 * cfg.save_every_minutes)
                if saving:
                    self.save()
                    last_save = self.elapsed
                if world.parallel and (saving or self._validation_due(step)):
                    world.barrier()  # the others wait (without spinning) while rank 0 validates or saves
        self._interrupted = stop.requested
        self.stop_signal = stop.signum if stop.requested else None  # train.py's exit status: 143 for SIGTERM
        self._save_last()
        return record

    def _numerics(self):
        """The GEMMs in ``cfg.precision`` for the loop. fp16 emulated on the host overflows now and then by
        design (the scaler backs off): numpy's warnings about it would only be noise."""
        stack = contextlib.ExitStack()
        stack.enter_context(matmul_precision(self.cfg.precision, "cpu" if self.xp is np else "cuda"))
        if self.scaler is not None:  # host floating-point flags, not array math
            stack.enter_context(np.errstate(over="ignore", invalid="ignore"))
        return stack

    def _save_last(self) -> None:
        """After the loop: the checkpoint of the last step (rank 0), then every rank waits for it. After a stop
        signal, the command's one line on stderr (where a stop is reported, as every command's is) says which
        signal, the step and the checkpoint saved."""
        if self.world.is_main:
            if not self.folder.holds_checkpoint_of(self.optimizer.step_count):
                self.save()
            if self._interrupted:
                print(f"{what_stopped(self.stop_signal)} at step {self.optimizer.step_count}: saved "
                      f"{self.checkpoints()[-1]}; continue with --resume", file=sys.stderr, flush=True)
        if self.world.parallel:  # no rank leaves (and no mpirun ends the job) before the last checkpoint is written
            self.world.barrier()

    def done(self) -> bool:
        """Whether the budget (``max_steps`` or ``max_minutes``) is spent."""
        c = self.cfg
        if c.max_steps is not None and self.optimizer.step_count >= c.max_steps:
            return True
        return c.max_minutes is not None and self.elapsed >= 60 * c.max_minutes

    def _log(self, step: int, gnorm: float, bar) -> dict | None:
        """After a good step: the progress bar; every ``log_every`` steps a metrics record (training
        loss, learning rate, gradient norm, speed), every ``eval_every`` steps validation (rank 0)."""
        cfg = self.cfg
        if bar is not None:
            bar.update(step, self.elapsed)
        validate = self._validation_due(step) and self.world.is_main
        if step % cfg.log_every == 0:
            record = train_record(step, self.window, self.schedule(step), gnorm, self.elapsed, self.epoch)
            if self.scaler is not None:
                record["loss_scale"] = self.scaler.scale
                record["overflow_steps"] = self.scaler.skipped_steps
            if self.skipped_steps:
                record["skipped_steps"] = self.skipped_steps
            noise = self.grad_stats.noise_at(step) if self.grad_stats is not None else None
            if noise is not None:  # a --log-grads step: the whole model's noise scale and SNR (grad_stats.jsonl: all)
                record["noise_scale"], record["gradient_snr"] = noise["b_simple"], noise["snr"]
            if bar is not None:
                bar.update(step, self.elapsed, loss=f"{record['train_loss']:.3f}", lr=f"{record['lr']:.2e}",
                           tok_s=f"{record['tokens_per_s']:.0f}")
            self.window = LogWindow()
            if validate:
                record.update(self.validate())
        elif validate:
            record = {"step": step, "elapsed": round(self.elapsed, 2), **self.validate()}
        else:
            return None
        self.write_metrics(record)
        return record

    def _validation_due(self, step: int) -> bool:
        return bool(self.cfg.eval_every) and step % self.cfg.eval_every == 0

    def write_metrics(self, record: dict) -> None:
        """Append one record to ``metrics.jsonl`` (rank 0): every metrics line of the run goes through here."""
        if self.world.is_main:
            self.folder.append_metrics(record)
            if self.tensorboard is not None:  # the same numbers as event files (and attention images after validation)
                self.tensorboard.metrics(record)

    def _skipped(self, step: int, loss, gnorm) -> None:
        """Log a dropped non-finite step; stop after ``max_nonfinite_in_a_row`` of them in a row."""
        self.skipped_steps += 1
        self.nonfinite_in_a_row += 1
        limit = self.cfg.max_nonfinite_in_a_row
        self.log(f"step {step + 1}: loss {float(loss):.4g}, gradient norm {float(gnorm):.4g}: not finite, "
                 f"step skipped ({self.skipped_steps} skipped in all, {self.nonfinite_in_a_row} in a row, "
                 f"stopping at {limit})")
        self.write_metrics({"step": step, "skipped": True, "skipped_steps": self.skipped_steps,
                            "nonfinite_in_a_row": self.nonfinite_in_a_row, "elapsed": round(self.elapsed, 2),
                            "epoch": self.epoch})
        if self.nonfinite_in_a_row >= limit:
            found = self.checkpoints()
            last = f"the last good checkpoint is {found[-1]}" if found else "no checkpoint was written"
            # every rank sees the same summed gradient, so every rank stops here together
            raise mark_collective(StopTraining(
                f"{self.nonfinite_in_a_row} steps in a row had a non-finite loss or gradient "
                f"({self.skipped_steps} skipped in all): training stopped at step {step}; {last}; "
                "lower --lr-factor or set --clip-norm, then continue with --resume"))

    # -- evaluation ----------------------------------------------------------------------------------
    def validate(self) -> dict:
        """Validation during training (rank 0): loss and perplexity over the validation split, greedy
        BLEU of its first ``eval_sentences``; the record's ``valid_*`` fields."""
        return self.evaluate("valid", self.cfg.eval_sentences)

    def evaluate(self, split: str = "valid", bleu_sentences: int | None = None, opts=None) -> dict:
        """Loss and perplexity over the whole split; BLEU of the first ``bleu_sentences`` (0: none)."""
        return evaluate(self.model, self.data, split, self.cfg.max_tokens, bleu_sentences, opts)

    # -- checkpoints ---------------------------------------------------------------------------------
    def save(self) -> Path | None:
        """Write the checkpoint of the current step (rank 0 only; None on the other ranks): the weights,
        Adam's state, the dropout RNG, where training stands, and the vocabulary (one file is a whole model)."""
        if not self.world.is_main:
            return None
        meta = {**self._progress(), "rng": self.model.rng.get_state(), "model_config": self.model.cfg.to_dict(),
                "vocab_size": self.vocab.size, "vocab_sha256": self._vocab_sha256, "data": self.data.source}
        return self.folder.save_checkpoint(self.optimizer.step_count, self.model.state_dict(), meta,
                                           self.optimizer.state_dict(), self.vocab.to_bytes(), self.cfg.keep_last)

    def checkpoints(self) -> list[Path]:
        """Checkpoint files of this run, oldest first."""
        return self.folder.checkpoints()

    def checkpoint_bytes(self) -> int:
        """Size of one checkpoint: weights and Adam's two moments, plus room for metadata."""
        weights = sum(int(p.data.size) * p.data.dtype.itemsize for p in self.model.parameters())
        return 3 * weights + (1 << 20)

    def resume(self) -> bool:
        """Load the newest readable checkpoint of the run (see RunFolder.resumable_checkpoint); False
        when there is none.

        Several ranks: rank 0 alone reads the run folder (the others need no copy of it); its
        weights, Adam state and data position reach them when :meth:`train` starts.
        """
        if not self.world.parallel:
            return self._resume_here()
        return bool(self.world.broadcast_object(self.world.on_main(self._resume_here)))

    def _resume_here(self) -> bool:
        found = self.folder.resumable_checkpoint(self.model.cfg.to_dict(), self._vocab_sha256, self.log)
        if found is None:
            return False
        ck, path = found
        try:
            self.model.load_state_dict(ck.model)
            self.optimizer.load_state_dict(ck.optimizer)
        except ValueError as exc:
            raise CheckpointError(f"{path} does not fit its own model config ({exc}): it is corrupt, "
                                  f"remove it and resume from an earlier one") from None
        self.model.rng.set_state(ck.meta["rng"])
        self._restore_progress(ck.meta)
        self.nonfinite_in_a_row = 0
        self.folder.truncate_metrics(self.optimizer.step_count)
        self.log(f"resumed from {path.name} (step {self.optimizer.step_count}, epoch {self.epoch})")
        return True

    def _progress(self) -> dict:
        """Where training stands, besides weights and Adam's moments: what a checkpoint records and what
        every replica takes from rank 0 at the start."""
        return {"step": self.optimizer.step_count, "epoch": self.epoch, "batch_pos": self.batch_pos,
                "elapsed": self.elapsed, "skipped_steps": self.skipped_steps, "log_window": self.window.to_list(),
                "loss_scaler": None if self.scaler is None else self.scaler.state_dict()}

    def _restore_progress(self, progress: dict) -> None:
        self.optimizer.step_count = progress["step"]
        self.training_batches.seek(progress["epoch"], progress["batch_pos"])
        self.elapsed = progress["elapsed"]
        self.skipped_steps = progress.get("skipped_steps", 0)
        self.window = LogWindow.from_list(progress.get("log_window"))  # the first log line after a resume
        if self.scaler is not None and progress.get("loss_scaler"):  # fp16: every rank scales alike
            self.scaler.load_state_dict(progress["loss_scaler"])

    def average(self) -> Path | None:
        """Average the last ``average_last`` checkpoints into OUT/averaged.npz (None if fewer than 2, or not rank 0)."""
        return self.folder.average(self.cfg.average_last) if self.world.is_main else None


def _quiet(*args, **kwargs) -> None:
    """The log of ranks other than 0: rank 0 speaks for all of them."""


@contextlib.contextmanager
def _closing_optional(closable):
    """``contextlib.closing`` for what may be None (the progress bar, the TensorBoard log): closed however
    the loop ends."""
    try:
        yield closable
    finally:
        if closable is not None:
            closable.close()
