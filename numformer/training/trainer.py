"""The training step and loop (Section 5): token batches, gradient accumulation, Adam + warmup, validation.

One optimizer step (Section 5.3) = ``accum`` batches of up to ``max_tokens`` tokens each: forward,
label-smoothed loss (Section 5.4), backward, then one Adam step with the warmup schedule of Eq. 3.
The loss of each batch is divided by the target-token count of the whole step, so accumulated
gradients equal those of one big batch. :meth:`Trainer.train_step` is the step,
:meth:`Trainer._train` the loop, :meth:`Trainer.evaluate` the validation; read them top to bottom.

What happens around them lives elsewhere: the run folder (checkpoints written and rotated, the
preflight, resume checks, metrics, averaging, the lock) in :mod:`numformer.training.run_folder`; the
bookkeeping of several processes (start-up sync, agreement on the clock and on stopping, signals)
in :mod:`numformer.training.replicas`; the configuration in :mod:`numformer.training.config`.

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
(:func:`dropout_seed`), so a batch sees the same masks whichever process computes it, with any
number of processes and any ``accum``, and after a resume.

Several processes (``world``, see :mod:`numformer.training.distributed`): each optimizer step takes
``world.size * accum`` batches from the epoch's list (the same list on every rank), deals ``accum``
of them to each rank by token count, normalises the loss by the target tokens of all of them, and
sums gradients and loss across ranks in one call before the update, which is then the update one
process would make on all those batches. Rank 0 alone writes the run folder, logs and draws the
progress bar.
"""
from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import numpy as np

from ..backend import to_host
from ..checkpoint import CheckpointError, vocab_fingerprint
from ..data import DataError, plan_batches
from .distributed import SINGLE, GradientBucket, mark_collective, shard_batches
from ..errors import StopTraining
from .gradient_statistics import GradStats
from ..loss import LabelSmoothedCrossEntropy
from ..optim import Adam, NoamSchedule, clip_grad_norm, grad_norm
from ..precision import DynamicLossScaler, matmul_precision
from .progress import BudgetBar
from .replicas import StopRequests, sync_replicas
from .run_folder import RunFolder
from .tensorboard_log import TensorBoardLog
from .config import TrainConfig
from ..decoding.translation import DecodeOptions, score_translations, translate_lines

OVERFLOW = "overflow"  # train_step's status for an fp16 step skipped by the loss scaler (not a failure)


class Trainer:
    """Trains ``model`` on ``data`` (a PreparedData) into the run folder ``out`` (a path or a
    :class:`~numformer.training.run_folder.RunFolder`; a path is locked for this process, on rank 0).

    ``world``: the processes training this model together (default: this one alone). With several,
    every rank builds a Trainer over the same model config and training ids; only rank 0 needs the
    run folder, the validation and test data.
    """

    def __init__(self, model, data, cfg: TrainConfig, out, progress: bool = True, log=print, world=None):
        self.world = world = SINGLE if world is None else world
        self.model, self.data, self.cfg = model, data, cfg.validate(positional_table=model.cfg.max_len)
        self.folder = out if isinstance(out, RunFolder) else RunFolder(out, lock=world.is_main)
        self.log = log if world.is_main else _quiet
        self.progress = progress and world.is_main
        self.xp = model.xp
        self._device = "cpu" if self.xp is np else "cuda"
        self.criterion = LabelSmoothedCrossEntropy(model.cfg.label_smoothing, model.cfg.pad_id)
        self.schedule = NoamSchedule(model.cfg.d_model, cfg.warmup, cfg.lr_factor)
        self.optimizer = Adam(model.parameters(), schedule=self.schedule)
        # fp16 GEMMs: gradients below float16's range would vanish without loss scaling (Micikevicius et al.)
        self.scaler = DynamicLossScaler() if cfg.precision == "fp16" else None
        self.vocab = data.vocab
        self._vocab_sha256 = vocab_fingerprint(data.vocab)
        self.epoch, self.batch_pos, self.elapsed = 0, 0, 0.0   # the data position and the training clock
        self.skipped_steps = 0      # non-finite steps skipped over the whole run
        self.nonfinite_in_a_row = 0
        self._window = [0, 0.0, 0.0, 0]  # since the last log line: tokens, seconds, loss sum, good steps
        self._epoch_batches = None
        self._interrupted = False
        self.grad_stats = (GradStats(model, self.folder.path / "grad_stats.jsonl")
                           if cfg.log_grads and world.is_main else None)
        self.tensorboard = (TensorBoardLog(self.folder.path, model, data)  # cfg.tensorboard: event files too
                            if cfg.tensorboard and world.is_main else None)
        # Several ranks: every gradient a view into one buffer (two extra slots carry the loss and the
        # NLL), summed across ranks with one call per step.
        self._bucket = GradientBucket(self.optimizer.params, extra=2) if world.parallel else None
        # several processes: masks must not depend on which rank computes a batch
        self._batch_seeded = cfg.dropout_rng == "batch" or world.parallel

    @property
    def interrupted(self) -> bool:
        """True when SIGINT or SIGTERM ended the last :meth:`train` early (a checkpoint was saved)."""
        return self._interrupted

    # -- one step ------------------------------------------------------------------------------------
    def train_step(self, batches, keys=None):
        """Forward and backward over this process's share of ``batches``, gradients summed over the
        processes, then one Adam step. Returns (loss, nll_sum, tokens, gnorm, ok) of the whole step;
        loss and gnorm are host floats (read back together: one device sync per step), nll_sum stays
        on the device.

        ``batches``: the step's batches for all processes (``world.size * accum``); ``keys``: their
        (epoch, position), which seed their dropout masks (None: the RNG stream runs on). The loss is
        divided by the target tokens of all of them, so the summed gradient is that of one big batch.
        """
        xp, model, crit, world = self.xp, self.model, self.criterion, self.world
        n_tokens = sum(b.n_tgt_tokens for b in batches)  # every rank knows every batch: no message needed
        mine = (range(len(batches)) if world.size == 1
                else shard_batches([b.n_padded_tokens for b in batches], world.size, world.rank))
        loss_total, nll_total = 0.0, 0.0
        stats = self.grad_stats if self._log_grads_now() else None
        last = mine[-1]
        for i in mine:
            b = batches[i]
            if keys is not None:
                model.rng.set_state({"seed": dropout_seed(self.cfg.seed, *keys[i])})
            if stats is not None and i == last:
                stats.start()
            logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))
            if stats is not None and i == last:
                stats.after_forward()
            loss_total = loss_total + crit.forward(logits, xp.asarray(b.tgt_out), normalizer=n_tokens,
                                                   overwrite_logits=True)
            nll_total = nll_total + crit.nll_sum
            dlogits = crit.backward()
            model.backward(dlogits if self.scaler is None else self.scaler.scale_grad_(dlogits))
        if self._bucket is not None:  # identical summed gradients (and loss) on every rank from here on
            loss_total, nll_total = self._bucket.allreduce_(world, loss_total, nll_total)
        params = self.optimizer.params
        if self.scaler is not None:  # the true gradient, before its norm is taken or clipped
            self.scaler.unscale_(params)
        if self.cfg.clip_norm > 0:
            gnorm = clip_grad_norm(params, self.cfg.clip_norm)
        else:
            gnorm = grad_norm(params)
        # The one read back to the host per step (on a GPU, the step's only sync): the loss and the
        # gradient norm in one transfer, for the non-finite check, the loss scaler and the log line.
        loss_total, gnorm = read_scalars(xp, loss_total, gnorm)
        loss_ok = math.isfinite(loss_total)
        if self.scaler is not None and loss_ok:
            if self.scaler.update(found_nonfinite=not math.isfinite(gnorm)):
                self.optimizer.zero_grad()
                if not self.scaler.exhausted:
                    # fp16 overflow of the scaled gradient: the scale was halved; a normal event, not a failure
                    return loss_total, nll_total, n_tokens, gnorm, OVERFLOW
                return loss_total, nll_total, n_tokens, gnorm, False
        elif not (loss_ok and math.isfinite(gnorm)):
            self.optimizer.zero_grad()  # the step is dropped: no Adam update, no step count
            return loss_total, nll_total, n_tokens, gnorm, False
        if stats is not None:
            stats.before_step()
            if self.tensorboard is not None:  # weight and gradient histograms on the same steps
                self.tensorboard.histograms(self.optimizer.step_count + 1)
        self.optimizer.step(zero_grad=True)  # each gradient zeroed as soon as its update has read it
        if stats is not None:
            stats.after_step(self.optimizer.step_count)  # uses the gradient norms before_step took
        return loss_total, nll_total, n_tokens, gnorm, True

    def _log_grads_now(self) -> bool:
        """Whether the coming optimizer step is one whose statistics ``--log-grads N`` records."""
        n = self.cfg.log_grads
        return bool(n) and (self.optimizer.step_count + 1) % n == 0

    # -- the loop ------------------------------------------------------------------------------------
    def train(self) -> dict:
        """Run until max_steps or max_minutes (or SIGINT/SIGTERM); returns the last metrics record.

        The GEMMs run in ``cfg.precision`` for the duration (validation during training included),
        and the previous precision is restored afterwards. Raises StopTraining after
        ``max_nonfinite_in_a_row`` non-finite steps in a row, and CheckpointError (before the first
        step) when the run folder cannot hold the checkpoints.
        """
        # fp16 emulated on the host overflows now and then by design (the scaler backs off): numpy's
        # warnings about it would only be noise. (Host floating-point flags, not array math.)
        quiet = np.errstate(over="ignore", invalid="ignore") if self.scaler is not None else contextlib.nullcontext()
        with matmul_precision(self.cfg.precision, self._device), quiet:
            return self._train()

    def _train(self) -> dict:
        cfg, world = self.cfg, self.world
        world.on_main(self.folder.preflight, self.checkpoint_bytes(), cfg.keep_last)  # fails every rank
        self._restore_progress(sync_replicas(world, self.optimizer, self._progress()))  # rank 0's start
        if self.tensorboard is not None:  # after a resume: events past the checkpoint's step are hidden
            self.tensorboard.open(self.optimizer.step_count)
        self.model.train()
        bar = BudgetBar(cfg.max_steps, cfg.max_minutes, self.optimizer.step_count, self.elapsed) \
            if self.progress else None
        last_save, record = self.elapsed, {}
        with StopRequests(world) as stop, _closing(bar), _closing(self.tensorboard):
            while not self.done() and not stop.requested:
                t0 = time.perf_counter()
                batches, keys = self._next_batches()
                loss, nll, n_tokens, gnorm, ok = self.train_step(batches, keys if self._batch_seeded else None)
                dt = time.perf_counter() - t0
                self.elapsed = stop.agree(self.elapsed + dt)  # several ranks: rank 0's clock, anyone's stop
                self._window[0] += n_tokens
                self._window[1] += dt
                if ok is OVERFLOW:  # fp16: the scaler halved its scale; the next batches redo the step
                    continue
                if not ok:
                    self._skipped(self.optimizer.step_count, loss, gnorm)
                    continue
                step = self.optimizer.step_count
                self.nonfinite_in_a_row = 0
                self._window[2] += loss
                self._window[3] += 1
                record = self._log(step, gnorm, bar) or record
                saving = (cfg.save_every and step % cfg.save_every == 0) or (
                    cfg.save_every_minutes and self.elapsed - last_save >= 60 * cfg.save_every_minutes)
                if saving:
                    self.save()
                    last_save = self.elapsed
                if world.parallel and (saving or self._validation_due(step)):
                    world.barrier()  # the others wait (without spinning) while rank 0 validates or saves
        self._interrupted = stop.requested
        if world.is_main:
            if not self.folder.holds_checkpoint_of(self.optimizer.step_count):
                self.save()
            if self._interrupted:
                self.log(f"interrupted at step {self.optimizer.step_count}: saved {self.checkpoints()[-1]}; "
                         "continue with --resume")
        if world.parallel:  # no rank leaves (and no mpirun ends the job) before the last checkpoint is written
            world.barrier()
        return record

    def done(self) -> bool:
        """Whether the budget (``max_steps`` or ``max_minutes``) is spent."""
        c = self.cfg
        if c.max_steps is not None and self.optimizer.step_count >= c.max_steps:
            return True
        return c.max_minutes is not None and self.elapsed >= 60 * c.max_minutes

    def _log(self, step: int, gnorm: float, bar) -> dict | None:
        """After a good step: the progress bar; every ``log_every`` steps a metrics record (training
        loss, learning rate, gradient norm, speed), every ``eval_every`` steps validation (rank 0)."""
        cfg, window = self.cfg, self._window
        if bar is not None:
            bar.update(step, self.elapsed)
        validate = self._validation_due(step) and self.world.is_main
        if step % cfg.log_every == 0:
            record = {"step": step, "train_loss": window[2] / window[3], "lr": self.schedule(step),
                      "grad_norm": float(gnorm), "tokens_per_s": window[0] / max(window[1], 1e-9),
                      "elapsed": round(self.elapsed, 2), "epoch": self.epoch}
            if self.scaler is not None:
                record["loss_scale"] = self.scaler.scale
                record["overflow_steps"] = self.scaler.skipped_steps
            if self.skipped_steps:
                record["skipped_steps"] = self.skipped_steps
            if bar is not None:
                bar.update(step, self.elapsed, loss=f"{record['train_loss']:.3f}", lr=f"{record['lr']:.2e}",
                           tok_s=f"{record['tokens_per_s']:.0f}")
            window[:] = [0, 0.0, 0.0, 0]
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

    # -- data ----------------------------------------------------------------------------------------
    def _batches(self, epoch: int):
        """The epoch's :class:`~numformer.data.batching.BatchPlan`: pair indices per batch, planned from the
        sentence lengths alone (the batches themselves are gathered from the map when trained on)."""
        plan = plan_batches(*self.data.ids["train"].lengths, self.cfg.max_tokens, shuffle_seed=self.cfg.seed,
                            epoch=epoch, max_len=self.cfg.max_len)
        if not len(plan):
            raise DataError(f"all {plan.n_filtered} training pairs are longer than --max-len {self.cfg.max_len} "
                             f"subwords: raise --max-len (at most {self.model.cfg.max_len})")
        if epoch == 0 or self._epoch_batches is None:
            self.log(f"epoch {epoch}: {plan.n_pairs} pairs in {len(plan)} batches"
                     + (f", {plan.n_filtered} longer than --max-len {self.cfg.max_len} left out"
                        if plan.n_filtered else ""))
        return plan

    def _next_batches(self):
        """The next optimizer step's batches, ``accum`` per process, and each one's (epoch, position).

        Every rank walks the same epoch plans, so the data position stays the same on all of them;
        each rank gathers every batch of the step (the dealing needs their sizes) from the shared map.
        """
        out, keys = [], []
        v, pairs = self.vocab, self.data.ids["train"]
        while len(out) < self.cfg.accum * self.world.size:
            if self._epoch_batches is None:
                self._epoch_batches = self._batches(self.epoch)
            if self.batch_pos >= len(self._epoch_batches):
                self.epoch, self.batch_pos = self.epoch + 1, 0
                self._epoch_batches = self._batches(self.epoch)
            out.append(pairs.batch(self._epoch_batches[self.batch_pos], v.pad_id, v.bos_id, v.eos_id))
            keys.append((self.epoch, self.batch_pos))
            self.batch_pos += 1
        return out, keys

    # -- evaluation ----------------------------------------------------------------------------------
    def validate(self) -> dict:
        """Validation during training (rank 0): loss and perplexity over the validation split, greedy
        BLEU of its first ``eval_sentences``; the record's ``valid_*`` fields. Validation ends here."""
        return self.evaluate("valid", self.cfg.eval_sentences)

    def evaluate(self, split: str = "valid", bleu_sentences: int | None = None, opts: DecodeOptions | None = None):
        """Loss and perplexity over the whole split; BLEU of the first ``bleu_sentences`` (0: none)."""
        pairs = self.data.ids.get(split)
        if pairs is None or not len(pairs):
            return {}
        model, xp, v = self.model, self.xp, self.vocab
        crit = LabelSmoothedCrossEntropy(self.model.cfg.label_smoothing, self.model.cfg.pad_id)
        was_training = model.training
        model.eval()
        loss_sum = nll_sum = n = 0.0
        try:
            plan = plan_batches(*pairs.lengths, max(self.cfg.max_tokens, 2000), max_len=self.model.cfg.max_len - 2)
            for i in range(len(plan)):
                b = pairs.batch(plan[i], v.pad_id, v.bos_id, v.eos_id)
                logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))
                loss_sum += float(crit.forward(logits, xp.asarray(b.tgt_out), normalizer=1,
                                               keep_for_backward=False))
                nll_sum += float(crit.nll_sum)
                n += b.n_tgt_tokens
        finally:
            model.train(was_training)
        if n == 0:  # every pair longer than the positional table
            return {}
        out = {f"{split}_loss": loss_sum / n, f"{split}_nll": nll_sum / n, f"{split}_ppl": math.exp(nll_sum / n)}
        if bleu_sentences:
            src_text, tgt_text = self.data.text[split]
            hyps = translate_lines(model, v, src_text[:bleu_sentences], opts or DecodeOptions(beam=1))
            out[f"{split}_bleu"] = score_translations(hyps, tgt_text[:bleu_sentences])["bleu"]
        return out

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
                "elapsed": self.elapsed, "skipped_steps": self.skipped_steps, "log_window": list(self._window),
                "loss_scaler": None if self.scaler is None else self.scaler.state_dict()}

    def _restore_progress(self, progress: dict) -> None:
        self.optimizer.step_count = progress["step"]
        self.epoch, self.batch_pos, self.elapsed = progress["epoch"], progress["batch_pos"], progress["elapsed"]
        self.skipped_steps = progress.get("skipped_steps", 0)
        window = progress.get("log_window")  # so the first log line after a resume averages the same steps
        self._window = list(window) if isinstance(window, list) and len(window) == 4 else [0, 0.0, 0.0, 0]
        if self.scaler is not None and progress.get("loss_scaler"):  # fp16: every rank scales alike
            self.scaler.load_state_dict(progress["loss_scaler"])
        self._epoch_batches = None

    def average(self) -> Path | None:
        """Average the last ``average_last`` checkpoints into OUT/averaged.npz (None if fewer than 2, or not rank 0)."""
        return self.folder.average(self.cfg.average_last) if self.world.is_main else None


def dropout_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of the dropout masks of batch ``position`` of ``epoch`` in a run seeded ``seed``.

    A function of the batch alone (not of the process that computes it, nor of the step it
    falls in), so data parallelism and gradient accumulation see the same masks. SeedSequence
    mixes the three numbers into well-spread bits; 63 of them fit every generator's seed.
    """
    # SeedSequence is host integer hashing, not array math: numpy is the right tool on any device.
    return int(np.random.SeedSequence([seed, epoch, position]).generate_state(1, np.uint64)[0] >> 1)


def read_scalars(xp, *values) -> list[float]:
    """Device scalars (0-d arrays or numbers) -> host floats, in one device-to-host copy.

    Each separate ``float(x)`` of a device value waits for the device; stacking them first
    makes it one wait (and one transfer) for all of them.
    """
    return [float(v) for v in to_host(xp.stack([xp.asarray(v, dtype=xp.float64).reshape(()) for v in values]))]


def _quiet(*args, **kwargs) -> None:
    """The log of ranks other than 0: rank 0 speaks for all of them."""


@contextlib.contextmanager
def _closing(bar):
    """Close the progress bar or the TensorBoard log (if any) however the loop ends."""
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()
