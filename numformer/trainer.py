"""The training loop: token batches, gradient accumulation, Adam + warmup, validation, checkpoints, resume.

One optimizer step (Section 5.3) = ``accum`` batches of up to ``max_tokens``
tokens each; the loss of each batch is divided by the target-token count of the
whole step, so accumulated gradients equal those of one big batch.

Faults (what the run folder guarantees):

* A step whose loss or gradient norm is not finite changes nothing (no Adam
  update), is logged with the running count and written to metrics.jsonl;
  ``max_nonfinite_in_a_row`` such steps in a row stop training with
  :class:`StopTraining`, without writing a checkpoint, so the last good one stays
  the newest.
* Checkpoints are written atomically (checkpoint.atomic_write): a SIGKILL at any
  moment leaves the previous checkpoint loadable; ``resume`` skips (and renames
  to ``*.corrupt``) an unreadable newest checkpoint and deletes leftover
  temporary files.
* SIGINT (Ctrl-C) or SIGTERM ends the current step, saves a checkpoint and
  returns (``interrupted`` is set); a second SIGINT stops at once.
* Before the first step, ``preflight`` checks that the checkpoint folder is
  writable and that the disk has room for ``keep_last`` checkpoints.

Run folder layout::

    OUT/spm.model                 shared sentencepiece vocabulary
    OUT/run.json                  model config, training config, data source
    OUT/metrics.jsonl             one JSON object per log line (plot with any tool)
    OUT/checkpoints/step_*.npz    the last ``keep_last`` checkpoints (atomic writes; each carries spm.model too)
    OUT/averaged.npz              the average of the last ``average_last`` (Section 6.1)

A checkpoint holds the weights, Adam's moments and step, the dropout RNG state,
the data position (epoch, batch) and the elapsed time, so ``--resume`` continues
exactly where the run stopped: on the CPU a resumed run is bit-identical to an
uninterrupted one.

Dropout masks (``dropout_rng``): "stream" (the default with one process) draws every mask
from the model's one RandomState, whose state checkpoints keep. "batch" (forced with several
processes) reseeds it before each batch from ``(seed, epoch, position of the batch in the
epoch)`` (:func:`dropout_seed`), so a batch sees the same masks whichever process computes
it, with any number of processes and any ``accum``, and after a resume without any RNG
state (checkpoints still hold one, so the format is the same).

Several processes (``world``, see :mod:`numformer.distributed`): each optimizer step takes
``world.size * accum`` batches from the epoch's list (the same list on every rank), deals
``accum`` of them to each rank by token count, normalises the loss by the target tokens
of all of them, and sums gradients and loss across ranks in one call before the update,
which is then the update one process would make on all those batches. Rank 0 alone
writes the run folder, logs and draws the progress bar. After each step the ranks agree
on rank 0's clock and on whether any of them was asked to stop (SIGINT, SIGTERM, and
SIGUSR1, which mpirun forwards to every rank), so they stop, save and end together.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .checkpoint import (CHECKPOINT_DIR, CheckpointError, atomic_write, average_checkpoints, load_checkpoint,
                         remove_stale_temporaries, run_checkpoints, save_checkpoint, step_checkpoint_path,
                         vocab_fingerprint)
from .backend import to_host
from .data import plan_batches
from .distributed import SINGLE, GradientBucket, broadcast_arrays_, mark_collective, shard_batches
from .grad_stats import GradStats
from .tensorboard_log import TensorBoardLog
from .loss import LabelSmoothedCrossEntropy
from .data import DataError
from .optim import Adam, NoamSchedule, clip_grad_norm, grad_norm
from .precision import MODES as PRECISIONS
from .precision import DynamicLossScaler, matmul_precision
from .progress import BudgetBar
from .translation import DecodeOptions, score_translations, translate_lines


@dataclass
class TrainConfig:
    """Everything about training that is not the architecture (defaults: the paper's recipe)."""

    max_tokens: int = 25000        # tokens per batch, source + target, padding included
    accum: int = 2                 # batches per optimizer step (2 x 25k ~ 25k source + 25k target)
    warmup: int = 4000
    lr_factor: float = 1.0         # multiplies Eq. 3
    clip_norm: float = 0.0         # 0: no clipping (the paper does not clip)
    max_steps: int | None = None
    max_minutes: float | None = None
    max_len: int = 256             # training pairs longer than this (subwords, per side) are dropped
    save_every: int = 1000         # steps; 0 = only by time
    save_every_minutes: float = 0  # 0 = only by steps
    keep_last: int = 5
    average_last: int = 5
    eval_every: int = 1000
    eval_sentences: int = 200      # validation BLEU on this many sentences (greedy, for speed)
    log_every: int = 10
    seed: int = 1
    log_grads: int = 0             # record per-layer gradient statistics every N steps (0: off)
    tensorboard: bool = False      # also write TensorBoard event files (numformer/tensorboard_log.py)
    dropout_rng: str = "stream"    # "stream": one generator per run; "batch": reseeded per batch (see above)
    precision: str = "fp32"        # matmuls: fp32, tf32 (GPU) or fp16 with loss scaling (numformer/precision.py)
    max_nonfinite_in_a_row: int = 10  # this many skipped (non-finite) steps in a row stop training

    def validate(self) -> None:
        if self.max_steps is None and self.max_minutes is None:
            raise ValueError("give --max-steps or --max-minutes (or both): training needs an end")
        flag = {"max_nonfinite_in_a_row": "stop-after-nonfinite"}
        for name in ("max_tokens", "accum", "warmup", "keep_last", "average_last", "log_every",
                     "max_nonfinite_in_a_row"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{flag.get(name, name.replace('_', '-'))} must be at least 1, "
                                 f"got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"--max-steps must be at least 1, got {self.max_steps}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"--max-minutes must be positive, got {self.max_minutes}")
        for name in ("save_every", "save_every_minutes", "eval_every", "eval_sentences", "clip_norm", "log_grads"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 0, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.dropout_rng not in ("stream", "batch"):
            raise ValueError(f"--dropout-rng must be stream or batch, got {self.dropout_rng!r}")
        if not self.lr_factor > 0:
            raise ValueError(f"--lr-factor must be positive, got {self.lr_factor}")
        if self.max_len < 2:
            raise ValueError(f"--max-len must be at least 2 (one token and the EOS), got {self.max_len}")
        if self.average_last > self.keep_last:
            raise ValueError(f"cannot average the last {self.average_last} checkpoints while keeping only "
                             f"{self.keep_last}: raise --keep-last or lower --average-last")


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


INIT_ONLY_FIELDS = ("init",)  # model config fields that only matter before the first step
OVERFLOW = "overflow"  # train_step's status for an fp16 step skipped by the loss scaler (not a failure)


class StopTraining(RuntimeError):
    """Training cannot go on (a run of non-finite steps); the message is one line, the last good
    checkpoint is untouched."""

    exit_code = 3


class Trainer:
    """Trains ``model`` on ``data`` (a PreparedData) into the run folder ``out``.

    ``world``: the processes training this model together (default: this one alone). With
    several, every rank builds a Trainer over the same model config and training ids; only
    rank 0 needs the run folder, the validation and test data.
    """

    world = SINGLE  # (class defaults: one process, for instances made without __init__)
    _bucket = None
    tensorboard = None  # a TensorBoardLog with cfg.tensorboard (rank 0)
    _stop_requested = False
    _batch_seeded = False

    def __init__(self, model, data, cfg: TrainConfig, out, progress: bool = True, log=print, world=None):
        cfg.validate()
        self.model, self.data, self.cfg = model, data, cfg
        self.world = world = SINGLE if world is None else world
        self.out = Path(out)
        self.ckpt_dir = self.out / CHECKPOINT_DIR
        self.log = log if world.is_main else _quiet
        self.progress = progress and world.is_main
        self.xp = model.xp
        mcfg = model.cfg
        self.criterion = LabelSmoothedCrossEntropy(mcfg.label_smoothing, mcfg.pad_id)
        self.schedule = NoamSchedule(mcfg.d_model, cfg.warmup, cfg.lr_factor)
        self.optimizer = Adam(model.parameters(), schedule=self.schedule)
        # fp16 GEMMs: gradients below float16's range would vanish without loss scaling (Micikevicius et al.)
        self.scaler = DynamicLossScaler() if cfg.precision == "fp16" else None
        self._device = "cpu" if self.xp is np else "cuda"
        self.vocab = data.vocab
        self._vocab_sha256 = vocab_fingerprint(data.vocab)
        self.epoch, self.batch_pos = 0, 0
        self.elapsed = 0.0
        self.skipped_steps = 0     # non-finite steps skipped over the whole run
        self.nonfinite_in_a_row = 0
        self._window = [0, 0.0, 0.0, 0]  # since the last log line: tokens, seconds, loss sum, good steps
        self._epoch_batches = None
        self.metrics_path = self.out / "metrics.jsonl"
        self.grad_stats = GradStats(model, self.out / "grad_stats.jsonl") if cfg.log_grads and world.is_main else None
        self.tensorboard = TensorBoardLog(self.out, model, data) if cfg.tensorboard and world.is_main else None
        self._interrupted = False
        self._stop_requested = False  # a signal seen by this rank, acted on once all ranks know (several ranks)
        # Several ranks: every gradient a view into one buffer (two extra slots carry the loss and the
        # NLL), summed across ranks with one call per step.
        self._bucket = GradientBucket(self.optimizer.params, extra=2) if world.parallel else None
        # several processes: masks must not depend on which rank computes a batch
        self._batch_seeded = cfg.dropout_rng == "batch" or world.parallel
        if cfg.max_len > mcfg.max_len:
            raise ValueError(f"--max-len {cfg.max_len} exceeds the model's positional table ({mcfg.max_len}): "
                             f"use --max-len {mcfg.max_len} or less")

    @property
    def interrupted(self) -> bool:
        """True when SIGINT or SIGTERM ended the last :meth:`train` early (a checkpoint was saved)."""
        return self._interrupted

    # -- data ------------------------------------------------------------------
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

    # -- one step ----------------------------------------------------------------
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

    # -- evaluation ----------------------------------------------------------------
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

    # -- checkpoints -------------------------------------------------------------------
    def checkpoints(self):
        """Checkpoint files of this run, oldest first."""
        return run_checkpoints(self.ckpt_dir.parent)

    def save(self) -> Path | None:
        """Write the checkpoint of the current step (rank 0 only; None on the other ranks)."""
        if not self.world.is_main:
            return None
        step = self.optimizer.step_count
        path = step_checkpoint_path(self.ckpt_dir.parent, step)
        meta = {
            "step": step, "epoch": self.epoch, "batch_pos": self.batch_pos, "elapsed": self.elapsed,
            "skipped_steps": self.skipped_steps, "rng": self.model.rng.get_state(), "log_window": self._window,
            "model_config": self.model.cfg.to_dict(), "train_config": asdict(self.cfg),
            "loss_scaler": None if self.scaler is None else self.scaler.state_dict(),
            "vocab_size": self.vocab.size, "vocab_sha256": self._vocab_sha256, "data": self.data.source,
        }
        try:
            save_checkpoint(path, self.model.state_dict(), meta, self.optimizer.state_dict(),
                            vocab=self.vocab.to_bytes())  # one file is a whole model
        except OSError as exc:
            previous = self.checkpoints()
            kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no checkpoint was written"
            raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}: {kept}; free disk space "
                                  "or fix the folder, then continue with --resume") from None
        for old in self.checkpoints()[: -self.cfg.keep_last]:
            try:
                old.unlink()
            except OSError:
                pass
        return path

    def checkpoint_bytes(self) -> int:
        """Size of one checkpoint: weights and Adam's two moments, plus room for metadata."""
        weights = sum(int(p.data.size) * p.data.dtype.itemsize for p in self.model.parameters())
        return 3 * weights + (1 << 20)

    def _prepare_folder(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.preflight()

    def preflight(self) -> None:
        """Fail now, in one line, if the run folder cannot hold the checkpoints (not after an hour).

        Checks that the checkpoint folder is writable, and that the disk has room for what training
        will add: up to ``keep_last`` checkpoints plus the one being written, and the average.
        """
        try:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            probe = self.ckpt_dir / ".write_probe.tmp"
            with open(probe, "wb") as f:
                f.write(b"numformer")
                f.flush()
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(f"cannot write to {self.ckpt_dir}: {exc.strerror or exc}: "
                                  "choose another --out or fix the folder's permissions") from None
        one = self.checkpoint_bytes()
        existing = len(self.checkpoints())
        weights = (one - (1 << 20)) // 3
        need = max(1, self.cfg.keep_last + 1 - existing) * one
        if not (self.out / "averaged.npz").exists():
            need += weights
        need = int(need * 1.1)
        free = shutil.disk_usage(self.ckpt_dir).free
        if free < need:
            mb = 1 << 20
            raise CheckpointError(
                f"not enough free disk space for {self.ckpt_dir}: {self.cfg.keep_last} checkpoints of "
                f"{one / mb:.0f} MB (weights and Adam moments) and their average need about {need / mb:.0f} MB, "
                f"{free / mb:.0f} MB are free: free some space, lower --keep-last or choose another --out")

    def resume(self) -> bool:
        """Load the newest readable checkpoint of the run; False when there is none.

        Leftover temporary files of a killed write are deleted; an unreadable checkpoint is renamed to
        ``*.corrupt`` (so nothing picks it up again) and the next older one is used. A checkpoint of
        another model config or vocabulary is a one-line CheckpointError.

        Several ranks: rank 0 alone reads the run folder (the others need no copy of it); its
        weights, Adam state and data position reach them when :meth:`train` starts.
        """
        if not self.world.parallel:
            return self._resume_here()
        return bool(self.world.broadcast_object(self.world.on_main(self._resume_here)))

    def _resume_here(self) -> bool:
        """:meth:`resume` from this process's view of the run folder."""
        for folder in (self.out, self.ckpt_dir):
            for tmp in remove_stale_temporaries(folder):
                self.log(f"removed {tmp}, left by an interrupted write")
        found = self.checkpoints()
        if not found:
            return False
        ck = None
        for path in reversed(found):
            try:
                ck = load_checkpoint(path)
                break
            except CheckpointError as exc:
                bad = path.with_name(path.name + ".corrupt")
                try:
                    path.rename(bad)
                    self.log(f"skipping unreadable checkpoint (renamed to {bad.name}): {exc}")
                except OSError:
                    self.log(f"skipping unreadable checkpoint: {exc}")
        if ck is None:
            raise CheckpointError(f"no readable checkpoint in {self.ckpt_dir}: remove the folder or start without "
                                  "--resume")
        saved, now = ck.meta.get("model_config"), self.model.cfg.to_dict()
        if isinstance(saved, dict):  # how the weights were first drawn does not matter once they are loaded
            saved = {k: v for k, v in saved.items() if k not in INIT_ONLY_FIELDS}
            now = {k: v for k, v in now.items() if k not in INIT_ONLY_FIELDS}
        if saved != now:
            if not isinstance(saved, dict):
                raise CheckpointError(f"{path} has no model config: it is not a numformer training checkpoint")
            diff = [f"{k} {saved.get(k)!r} (asked: {now.get(k)!r})" for k in sorted(set(saved) | set(now))
                    if saved.get(k) != now.get(k)]
            raise CheckpointError(f"{path} was trained with another model: {', '.join(diff[:4])}: resume with the "
                                  "run's --preset and model flags (or leave them out to use the run's)")
        expected = ck.meta.get("vocab_sha256")
        if expected and expected != self._vocab_sha256:
            raise CheckpointError(f"{path} was trained with another vocabulary than {self.out / 'spm.model'}: "
                                  "restore the run's spm.model or start a new run with another --out")
        if ck.optimizer is None or not all(k in ck.meta for k in ("rng", "epoch", "batch_pos", "elapsed")):
            raise CheckpointError(f"{path} holds no training state (optimizer, data position): it cannot be "
                                  "resumed, only translated with")
        try:
            self.model.load_state_dict(ck.model)
            self.optimizer.load_state_dict(ck.optimizer)
        except ValueError as exc:
            raise CheckpointError(f"{path} does not fit its own model config ({exc}): it is corrupt, "
                                  f"remove it and resume from an earlier one") from None
        self.model.rng.set_state(ck.meta["rng"])
        self.epoch, self.batch_pos = ck.meta["epoch"], ck.meta["batch_pos"]
        self.elapsed = ck.meta["elapsed"]
        self.skipped_steps = ck.meta.get("skipped_steps", 0)
        if self.scaler is not None and ck.meta.get("loss_scaler"):
            self.scaler.load_state_dict(ck.meta["loss_scaler"])
        self.nonfinite_in_a_row = 0
        window = ck.meta.get("log_window")  # so the first log line after a resume averages the same steps
        self._window = list(window) if isinstance(window, list) and len(window) == 4 else [0, 0.0, 0.0, 0]
        self._epoch_batches = None
        self._truncate_metrics(self.optimizer.step_count)
        self.log(f"resumed from {path.name} (step {self.optimizer.step_count}, epoch {self.epoch})")
        return True

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines logged after ``step`` (they belong to work the checkpoint does not hold),
        and a last line a kill cut in half."""
        if not self.metrics_path.exists():
            return
        kept = []
        for line in self.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            at = rec.get("step", 0)
            if at < step or (at == step and not rec.get("skipped")):
                kept.append(line)
        data = "".join(ln + "\n" for ln in kept).encode("utf-8")
        atomic_write(self.metrics_path, lambda f: f.write(data))

    def _sync_replicas(self) -> None:
        """Every rank takes rank 0's weights, Adam moments and step, data position, clock and counters.

        Called when training starts: the replicas begin identical (also after a resume that only
        rank 0 read) and identical updates of identical gradients keep them so.
        """
        world = self.world
        if not world.parallel:
            return
        opt = self.optimizer
        for arrays in ([p.data for p in opt.params], opt.m, opt.v):
            broadcast_arrays_(world, arrays)
        state = world.broadcast_object({"step_count": opt.step_count, "epoch": self.epoch, "batch_pos": self.batch_pos,
                                        "elapsed": self.elapsed, "skipped_steps": self.skipped_steps,
                                        "window": list(self._window),
                                        "loss_scaler": None if self.scaler is None else self.scaler.state_dict()})
        if self.scaler is not None:  # fp16: every rank unscales by, and backs off from, the same scale
            self.scaler.load_state_dict(state["loss_scaler"])
        opt.step_count = state["step_count"]
        self.epoch, self.batch_pos, self.elapsed = state["epoch"], state["batch_pos"], state["elapsed"]
        self.skipped_steps, self._window = state["skipped_steps"], list(state["window"])
        self._epoch_batches = None

    def _agree(self) -> None:
        """After each step (several ranks): rank 0's clock becomes every rank's ``elapsed``, and a stop
        asked of any rank becomes everyone's, so ``--max-minutes``, saving by time and signals end or
        save the same step everywhere. One small message per step."""
        main = self.world.is_main
        summed = self.world.allreduce_scalars([1.0 if self._stop_requested else 0.0, self.elapsed if main else 0.0])
        self._interrupted = self._interrupted or bool(summed[0] > 0)
        self.elapsed = float(summed[1])

    def _write_metrics(self, record: dict) -> None:
        if not self.world.is_main:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:  # the same numbers as event files (and attention images after validation)
            self.tensorboard.metrics(record)

    # -- the loop ------------------------------------------------------------------------
    def _done(self) -> bool:
        c = self.cfg
        if c.max_steps is not None and self.optimizer.step_count >= c.max_steps:
            return True
        return c.max_minutes is not None and self.elapsed >= 60 * c.max_minutes

    def train(self) -> dict:
        """Run until max_steps or max_minutes (or SIGINT/SIGTERM); returns the last metrics record.

        The GEMMs run in ``cfg.precision`` for the duration (validation during training included),
        and the previous precision is restored afterwards.
        Raises StopTraining after ``max_nonfinite_in_a_row`` non-finite steps in a row, and
        CheckpointError (before the first step) when the run folder cannot hold the checkpoints.
        """
        # fp16 emulated on the host overflows now and then by design (the scaler backs off): numpy's
        # warnings about it would only be noise. (Host floating-point flags, not array math.)
        quiet = np.errstate(over="ignore", invalid="ignore") if self.scaler is not None else contextlib.nullcontext()
        with matmul_precision(self.cfg.precision, self._device), quiet:
            return self._train()

    def _train(self) -> dict:
        cfg, world = self.cfg, self.world
        world.on_main(self._prepare_folder)  # rank 0's run folder; a failure there stops every rank
        self._sync_replicas()
        if self.tensorboard is not None:  # after a resume: events past the checkpoint's step are hidden
            self.tensorboard.open(self.optimizer.step_count)
        self._interrupted = self._stop_requested = False
        self.model.train()
        bar = None
        if self.progress:  # the bar shows elapsed and remaining of the budget (numformer/progress.py)
            bar = BudgetBar(cfg.max_steps, cfg.max_minutes, self.optimizer.step_count, self.elapsed)
        # mpirun ends the job on SIGINT/SIGTERM (SIGKILL a second later) but forwards SIGUSR1 to every
        # rank: with several ranks, SIGUSR1 is the graceful stop.
        handled = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGUSR1,) if world.parallel else ())
        previous = {}
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        last_save_time = self.elapsed
        window = self._window
        record = {}
        try:
            while not self._done() and not self._interrupted:
                t0 = time.perf_counter()
                batches, keys = self._next_batches()
                loss, nll, ntok, gnorm, ok = self.train_step(batches, keys if self._batch_seeded else None)
                step = self.optimizer.step_count
                dt = time.perf_counter() - t0
                self.elapsed += dt
                if world.parallel:
                    self._agree()
                window[0] += ntok
                window[1] += dt
                if ok is OVERFLOW:  # the scaler halved its scale; the step is redone with the next batches
                    continue
                if not ok:
                    self._skipped(step, loss, gnorm)
                    continue
                self.nonfinite_in_a_row = 0
                window[2] += float(loss)
                window[3] += 1
                if bar is not None:
                    bar.update(step, self.elapsed)
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
                    if cfg.eval_every and step % cfg.eval_every == 0 and world.is_main:
                        record.update(self.evaluate("valid", cfg.eval_sentences))
                    self._write_metrics(record)
                elif cfg.eval_every and step % cfg.eval_every == 0 and world.is_main:
                    record = {"step": step, "elapsed": round(self.elapsed, 2), **self.evaluate("valid", cfg.eval_sentences)}
                    self._write_metrics(record)
                by_steps = cfg.save_every and step % cfg.save_every == 0
                by_time = cfg.save_every_minutes and self.elapsed - last_save_time >= 60 * cfg.save_every_minutes
                if by_steps or by_time:
                    self.save()
                    last_save_time = self.elapsed
                if world.parallel and (by_steps or by_time or (cfg.eval_every and step % cfg.eval_every == 0)):
                    world.barrier()  # the others wait (without spinning) while rank 0 validates or saves
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if bar is not None:
                bar.close()
            if self.tensorboard is not None:
                self.tensorboard.close()
        if world.is_main:
            found = self.checkpoints()
            if not found or found[-1] != step_checkpoint_path(self.ckpt_dir.parent, self.optimizer.step_count):
                self.save()
            if self._interrupted:
                self.log(f"interrupted at step {self.optimizer.step_count}: saved {self.checkpoints()[-1]}; "
                         "continue with --resume")
        if world.parallel:  # no rank leaves (and no mpirun ends the job) before the last checkpoint is written
            world.barrier()
        return record

    def _skipped(self, step: int, loss, gnorm) -> None:
        """Log a dropped non-finite step; stop after ``max_nonfinite_in_a_row`` of them in a row."""
        self.skipped_steps += 1
        self.nonfinite_in_a_row += 1
        limit = self.cfg.max_nonfinite_in_a_row
        self.log(f"step {step + 1}: loss {float(loss):.4g}, gradient norm {float(gnorm):.4g}: not finite, "
                 f"step skipped ({self.skipped_steps} skipped in all, {self.nonfinite_in_a_row} in a row, "
                 f"stopping at {limit})")
        self._write_metrics({"step": step, "skipped": True, "skipped_steps": self.skipped_steps,
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

    def _on_signal(self, signum, frame):
        if (self._interrupted or self._stop_requested) and signum == signal.SIGINT:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        if self.world.parallel:
            self._stop_requested = True  # acted on after this step, once every rank knows (_agree)
        else:
            self._interrupted = True

    def average(self) -> Path | None:
        """Average the last ``average_last`` checkpoints into OUT/averaged.npz (None if fewer than 2, or not rank 0)."""
        if not self.world.is_main:
            return None
        paths = self.checkpoints()[-self.cfg.average_last:]
        if len(paths) < 2:
            return None
        ck = average_checkpoints(paths)
        path = self.out / "averaged.npz"
        save_checkpoint(path, ck.model, ck.meta, vocab=ck.vocab)
        return path


def _quiet(*args, **kwargs) -> None:
    """The log of ranks other than 0: rank 0 speaks for all of them."""
