"""The training loop: token batches, gradient accumulation, Adam + warmup, validation, checkpoints, resume.

One optimizer step (Section 5.3) = ``accum`` batches of up to ``max_tokens``
tokens each; the loss of each batch is divided by the target-token count of the
whole step, so accumulated gradients equal those of one big batch. Steps whose
loss or gradient norm is not finite are skipped and counted.

Run folder layout::

    OUT/spm.model                 shared sentencepiece vocabulary
    OUT/run.json                  model config, training config, data source
    OUT/metrics.jsonl             one JSON object per log line (plot with any tool)
    OUT/checkpoints/step_*.npz    the last ``keep_last`` checkpoints (atomic writes)
    OUT/averaged.npz              the average of the last ``average_last`` (Section 6.1)

A checkpoint holds the weights, Adam's moments and step, the dropout RNG state,
the data position (epoch, batch) and the elapsed time, so ``--resume`` continues
exactly where the run stopped: on the CPU a resumed run is bit-identical to an
uninterrupted one.
"""
from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .checkpoint import CheckpointError, average_checkpoints, load_checkpoint, save_checkpoint
from .data import make_batches
from .loss import LabelSmoothedCrossEntropy
from .optim import Adam, NoamSchedule, clip_grad_norm, grad_norm
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

    def validate(self) -> None:
        if self.max_steps is None and self.max_minutes is None:
            raise ValueError("give --max-steps or --max-minutes (or both): training needs an end")
        for name in ("max_tokens", "accum", "warmup", "keep_last", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.average_last > self.keep_last:
            raise ValueError(f"cannot average the last {self.average_last} checkpoints while keeping only "
                             f"{self.keep_last}: raise --keep-last")


class StopTraining(Exception):
    pass


class Trainer:
    """Trains ``model`` on ``data`` (a PreparedData) into the run folder ``out``."""

    def __init__(self, model, data, cfg: TrainConfig, out, progress: bool = True, log=print):
        cfg.validate()
        self.model, self.data, self.cfg = model, data, cfg
        self.out = Path(out)
        self.ckpt_dir = self.out / "checkpoints"
        self.log = log
        self.progress = progress
        self.xp = model.xp
        mcfg = model.cfg
        self.criterion = LabelSmoothedCrossEntropy(mcfg.label_smoothing, mcfg.pad_id)
        self.schedule = NoamSchedule(mcfg.d_model, cfg.warmup, cfg.lr_factor)
        self.optimizer = Adam(model.parameters(), schedule=self.schedule)
        self.vocab = data.vocab
        self.epoch, self.batch_pos = 0, 0
        self.elapsed = 0.0
        self.skipped_steps = 0
        self._epoch_batches = None
        self.metrics_path = self.out / "metrics.jsonl"
        self._interrupted = False

    # -- data ------------------------------------------------------------------
    def _batches(self, epoch: int):
        src, tgt = self.data.ids["train"]
        v = self.vocab
        batches = make_batches(src, tgt, self.cfg.max_tokens, v.pad_id, v.bos_id, v.eos_id,
                               shuffle_seed=self.cfg.seed, epoch=epoch, max_len=self.cfg.max_len)
        if not batches:
            raise ValueError("no training pair is short enough for --max-len; raise it")
        if epoch == 0 or self._epoch_batches is None:
            self.log(f"epoch {epoch}: {batches.n_pairs} pairs in {len(batches)} batches"
                     + (f", {batches.n_filtered} longer than --max-len {self.cfg.max_len} left out"
                        if batches.n_filtered else ""))
        return batches

    def _next_batches(self):
        out = []
        while len(out) < self.cfg.accum:
            if self._epoch_batches is None:
                self._epoch_batches = self._batches(self.epoch)
            if self.batch_pos >= len(self._epoch_batches):
                self.epoch, self.batch_pos = self.epoch + 1, 0
                self._epoch_batches = self._batches(self.epoch)
            out.append(self._epoch_batches[self.batch_pos])
            self.batch_pos += 1
        return out

    # -- one step ----------------------------------------------------------------
    def train_step(self, batches):
        """Forward and backward over ``batches``, then one Adam step. Returns (loss, nll_sum, tokens, gnorm)."""
        xp, model, crit = self.xp, self.model, self.criterion
        n_tokens = sum(b.n_tgt_tokens for b in batches)
        loss_total, nll_total = 0.0, 0.0
        for b in batches:
            logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))
            loss_total = loss_total + crit.forward(logits, xp.asarray(b.tgt_out), normalizer=n_tokens,
                                                   overwrite_logits=True)
            nll_total = nll_total + crit.nll_sum
            model.backward(crit.backward())
        params = self.optimizer.params
        if self.cfg.clip_norm > 0:
            gnorm = clip_grad_norm(params, self.cfg.clip_norm)
        else:
            gnorm = grad_norm(params)
        if not (math.isfinite(float(loss_total)) and math.isfinite(float(gnorm))):
            self.skipped_steps += 1
            self.optimizer.zero_grad()
            return loss_total, nll_total, n_tokens, gnorm, False
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss_total, nll_total, n_tokens, gnorm, True

    # -- evaluation ----------------------------------------------------------------
    def evaluate(self, split: str = "valid", bleu_sentences: int | None = None, opts: DecodeOptions | None = None):
        """Loss and perplexity over the whole split; BLEU of the first ``bleu_sentences`` (0: none)."""
        if split not in self.data.ids or not self.data.ids[split][0]:
            return {}
        model, xp, v = self.model, self.xp, self.vocab
        src, tgt = self.data.ids[split]
        crit = LabelSmoothedCrossEntropy(self.model.cfg.label_smoothing, self.model.cfg.pad_id)
        was_training = model.training
        model.eval()
        loss_sum = nll_sum = n = 0.0
        try:
            for b in make_batches(src, tgt, max(self.cfg.max_tokens, 2000), v.pad_id, v.bos_id, v.eos_id,
                                  max_len=self.model.cfg.max_len - 2):
                logits = model(xp.asarray(b.src), xp.asarray(b.tgt_in))
                loss_sum += float(crit.forward(logits, xp.asarray(b.tgt_out), normalizer=1,
                                               keep_for_backward=False))
                nll_sum += float(crit.nll_sum)
                n += b.n_tgt_tokens
        finally:
            model.train(was_training)
        out = {f"{split}_loss": loss_sum / n, f"{split}_nll": nll_sum / n, f"{split}_ppl": math.exp(nll_sum / n)}
        if bleu_sentences:
            src_text, tgt_text = self.data.text[split]
            hyps = translate_lines(model, v, src_text[:bleu_sentences], opts or DecodeOptions(beam=1))
            out[f"{split}_bleu"] = score_translations(hyps, tgt_text[:bleu_sentences])["bleu"]
        return out

    # -- checkpoints -------------------------------------------------------------------
    def checkpoints(self):
        """Checkpoint files of this run, oldest first."""
        return sorted(self.ckpt_dir.glob("step_*.npz"))

    def save(self) -> Path:
        step = self.optimizer.step_count
        path = self.ckpt_dir / f"step_{step:07d}.npz"
        meta = {
            "step": step, "epoch": self.epoch, "batch_pos": self.batch_pos, "elapsed": self.elapsed,
            "skipped_steps": self.skipped_steps, "rng": self.model.rng.get_state(),
            "model_config": self.model.cfg.to_dict(), "train_config": asdict(self.cfg),
            "vocab_size": self.vocab.size, "data": self.data.source,
        }
        save_checkpoint(path, self.model.state_dict(), meta, self.optimizer.state_dict())
        for old in self.checkpoints()[: -self.cfg.keep_last]:
            old.unlink()
        return path

    def resume(self) -> bool:
        """Load the newest readable checkpoint of the run; False when there is none."""
        found = self.checkpoints()
        if not found:
            return False
        ck = None
        for path in reversed(found):
            try:
                ck = load_checkpoint(path)
                break
            except CheckpointError as exc:
                self.log(f"skipping unreadable checkpoint: {exc}")
        if ck is None:
            raise CheckpointError(f"no readable checkpoint in {self.ckpt_dir}: remove the folder or start without --resume")
        if ck.meta.get("model_config") != self.model.cfg.to_dict():
            raise CheckpointError(f"{path} was trained with another model config: use the same --preset and flags")
        self.model.load_state_dict(ck.model)
        self.optimizer.load_state_dict(ck.optimizer)
        self.model.rng.set_state(ck.meta["rng"])
        self.epoch, self.batch_pos = ck.meta["epoch"], ck.meta["batch_pos"]
        self.elapsed = ck.meta["elapsed"]
        self.skipped_steps = ck.meta.get("skipped_steps", 0)
        self._epoch_batches = None
        self._truncate_metrics(self.optimizer.step_count)
        self.log(f"resumed from {path.name} (step {self.optimizer.step_count}, epoch {self.epoch})")
        return True

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines logged after ``step`` (they belong to work the checkpoint does not hold)."""
        if not self.metrics_path.exists():
            return
        lines = [ln for ln in self.metrics_path.read_text().splitlines() if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= step]
        self.metrics_path.write_text("".join(ln + "\n" for ln in kept))

    def _write_metrics(self, record: dict) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    # -- the loop ------------------------------------------------------------------------
    def _done(self) -> bool:
        c = self.cfg
        if c.max_steps is not None and self.optimizer.step_count >= c.max_steps:
            return True
        return c.max_minutes is not None and self.elapsed >= 60 * c.max_minutes

    def train(self) -> dict:
        """Run until max_steps or max_minutes; returns the last metrics record."""
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.model.train()
        bar = None
        if self.progress:
            from tqdm import tqdm  # noqa: PLC0415

            bar = tqdm(total=cfg.max_steps, initial=self.optimizer.step_count, unit="step", dynamic_ncols=True,
                       mininterval=1.0)
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        last_save_time = self.elapsed
        window_tokens, window_time, window_loss, window_steps = 0, 0.0, 0.0, 0
        record = {}
        try:
            while not self._done() and not self._interrupted:
                t0 = time.perf_counter()
                batches = self._next_batches()
                loss, nll, ntok, gnorm, ok = self.train_step(batches)
                step = self.optimizer.step_count
                dt = time.perf_counter() - t0
                self.elapsed += dt
                window_tokens += ntok
                window_time += dt
                window_steps += 1
                window_loss += float(loss) if ok else 0.0
                if bar is not None:
                    bar.update(1 if ok else 0)
                if ok and step % cfg.log_every == 0:
                    record = {"step": step, "train_loss": window_loss / window_steps, "lr": self.schedule(step),
                              "grad_norm": float(gnorm), "tokens_per_s": window_tokens / max(window_time, 1e-9),
                              "elapsed": round(self.elapsed, 2), "epoch": self.epoch}
                    if bar is not None:
                        bar.set_postfix(loss=f"{record['train_loss']:.3f}", lr=f"{record['lr']:.2e}",
                                        tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
                    window_tokens, window_time, window_loss, window_steps = 0, 0.0, 0.0, 0
                    if cfg.eval_every and step % cfg.eval_every == 0:
                        record.update(self.evaluate("valid", cfg.eval_sentences))
                    self._write_metrics(record)
                elif ok and cfg.eval_every and step % cfg.eval_every == 0:
                    record = {"step": step, "elapsed": round(self.elapsed, 2), **self.evaluate("valid", cfg.eval_sentences)}
                    self._write_metrics(record)
                if self.skipped_steps >= 20 and not ok:
                    raise StopTraining(f"{self.skipped_steps} steps had a non-finite loss or gradient: stopping; "
                                       f"the last good checkpoint is in {self.ckpt_dir}")
                by_steps = ok and cfg.save_every and step % cfg.save_every == 0
                by_time = cfg.save_every_minutes and self.elapsed - last_save_time >= 60 * cfg.save_every_minutes
                if by_steps or by_time:
                    self.save()
                    last_save_time = self.elapsed
        finally:
            signal.signal(signal.SIGINT, previous)
            if bar is not None:
                bar.close()
        if not self.checkpoints() or not self.checkpoints()[-1].name.endswith(f"{self.optimizer.step_count:07d}.npz"):
            self.save()
        if self._interrupted:
            self.log(f"interrupted: saved {self.checkpoints()[-1]}; continue with --resume")
        return record

    def _on_sigint(self, signum, frame):
        if self._interrupted:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self._interrupted = True

    def average(self) -> Path | None:
        """Average the last ``average_last`` checkpoints into OUT/averaged.npz (None if fewer than 2)."""
        paths = self.checkpoints()[-self.cfg.average_last:]
        if len(paths) < 2:
            return None
        ck = average_checkpoints(paths)
        path = self.out / "averaged.npz"
        save_checkpoint(path, ck.model, ck.meta)
        return path
