"""A training run's folder: everything written into it, and the checks on what is found there. The
names of its files are :mod:`numformer.run_file_names`'s.

:class:`RunFolder` owns it for the trainer and for ``train.py``: the exclusive lock, taken first
(:func:`~numformer.training.run_lock.lock_run_folder`); ``run.json``, written once per start; the checks of
a new run (the folder holds no other run, no vocabulary of another corpus) and of the vocabulary
it may reuse; the preflight (the checkpoint folder is writable and the disk holds what training
will write); checkpoints written atomically and rotated (the last ``keep_last`` kept); the newest
readable checkpoint found for ``--resume`` (leftover temporaries deleted, an unreadable one renamed
``*.corrupt``) and checked against the model and vocabulary; ``metrics.jsonl`` appended, and cut back
on resume to the checkpoint's step; the last ``average_last`` checkpoints averaged (Section 6.1,
:mod:`numformer.checkpoint.averaging`). What a checkpoint holds is the trainer's business
(:meth:`numformer.training.trainer.Trainer.save`).

Faults it guarantees against: a SIGKILL at any moment leaves the previous checkpoint loadable; a
full disk while saving stops training with a line naming the intact previous checkpoint; a disk
without room for the checkpoints is reported before the first step, not after an hour.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .. import run_file_names
from ..checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_meta, save_checkpoint
from ..data.marian_vocab import is_marian_vocab_bytes
from ..file_kinds import shown
from ..errors import UsageError
from ..files import atomic_write_bytes, partial_prefix, sweep_stale_partials, write_json
from ..checkpoint.averaging import average_checkpoints
from .run_lock import lock_run_folder

INIT_ONLY_FIELDS = ("init",)  # model config fields that only matter before the first step
# The advice when a checkpoint's vocabulary is not the run's file's: the checkpoint carries its own.
_RESTORE = ("restore the run's {0}: remove (or move away) the one there and resume, and the vocabulary is written "
            "back from the checkpoint, which carries it; or start a new run with another --out")


class RunFolder:
    """The folder ``path`` of one training run, locked for this process when ``lock`` (rank 0)."""

    def __init__(self, path, lock: bool = True):
        self.path = Path(path)
        self.checkpoint_dir = self.path / run_file_names.CHECKPOINTS
        self.metrics_path = self.path / run_file_names.METRICS
        self.lock = lock_run_folder(self.path) if lock else None  # before anything in the folder is read

    def close(self) -> None:
        """Release the lock (the folder may then be taken by another process)."""
        if self.lock is not None:
            self.lock.release()

    # -- the run's settings -----------------------------------------------------------------------------
    def read_settings(self) -> dict | None:
        """``run.json`` as a dict (None when there is none); an unreadable one is a one-line UsageError."""
        path = self.path / run_file_names.SETTINGS
        if not path.is_file():
            return None
        try:
            settings = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
            raise UsageError(f"{path} is unreadable ({reason}): give the data, preset and settings flags again, "
                             "or delete it") from None
        if not isinstance(settings, dict):
            raise UsageError(f"{path} is unreadable (not a JSON object): give the data, preset and settings flags "
                             "again, or delete it")
        return settings

    def _model_settings_read_back(self) -> dict:
        """The model settings a resume took from this run's run.json unless a flag was given ({field: value}): all
        of them for a fine-tuning run (its architecture is the file's, not a preset's), else the few
        (numformer.training.config.RESUMED_MODEL_FIELDS). Empty when the file holds none."""
        from .config import RESUMED_MODEL_FIELDS  # noqa: PLC0415  (config is above this module)

        try:
            settings = self.read_settings() or {}
        except UsageError:
            return {}
        recorded = settings.get("model_config")
        if not isinstance(recorded, dict):
            return {}
        return dict(recorded) if settings.get("init_from") else {k: recorded[k] for k in RESUMED_MODEL_FIELDS
                                                                 if k in recorded}

    def _preset_read_back(self) -> str | None:
        """The preset this run's run.json names (what a resume without --preset builds; with one, the same), or
        None for a fine-tuning run (no preset's architecture) or none recorded."""
        try:
            settings = self.read_settings() or {}
        except UsageError:
            return None
        preset = settings.get("preset")
        return preset if isinstance(preset, str) and not settings.get("init_from") else None

    def write_settings(self, settings: dict) -> None:
        """Write ``run.json`` (atomically): the one record of the run's settings."""
        write_json(self.path / run_file_names.SETTINGS, settings)

    def check_new_run(self, source: str) -> None:
        """A new run (no ``--resume``) may not start over an existing one, nor reuse the vocabulary an
        earlier attempt on another corpus left here."""
        if self.checkpoints():
            raise UsageError(f"{self.path} already holds a run: pass --resume to continue it or choose another --out")
        if run_file_names.run_vocab(self.path).exists():
            old = self.read_settings()
            if old is not None and old.get("data") not in (None, source):
                raise UsageError(f"{self.path} holds the vocabulary of a run on {old['data']}: choose another --out "
                                 f"(or delete its {run_file_names.run_vocab(self.path).name})")

    def settle_vocabulary(self, vocab_size: int | None, resume: bool, asked_before: int | None, log=print) -> None:
        """``spm.model`` left by an earlier attempt is reused by preparation: never silently against
        ``--vocab-size``. A new run (no checkpoint yet) retrains it when the size asked for differs; a
        resumed run keeps the vocabulary its checkpoints were trained with, so another size is refused.
        ``asked_before``: the ``--vocab-size`` the run asked for (run.json; the data may allow fewer)."""
        from ..data.marian_vocab import load_vocab_file  # noqa: PLC0415  (sentencepiece only when one is there)

        path = run_file_names.run_vocab(self.path)
        if not path.exists():
            return
        vocab = load_vocab_file(path)
        if vocab_size is None or vocab_size == vocab.size:
            log(f"vocabulary: reusing {path} ({vocab.size} pieces)")
            return
        if resume and self.checkpoints():
            if asked_before == vocab_size:  # the size the run asked for; the data allowed fewer pieces
                return
            raise UsageError(f"--vocab-size {vocab_size} differs from the run's vocabulary ({vocab.size} pieces in "
                             f"{path}): a resumed run keeps its vocabulary: leave --vocab-size out, or start a new "
                             "run with another --out")
        if asked_before == vocab_size:
            log(f"vocabulary: reusing {path} ({vocab.size} pieces: all that --vocab-size {vocab_size} allowed on "
                "this data)")
            return
        log(f"vocabulary: {path} has {vocab.size} pieces, --vocab-size asks for {vocab_size}: retraining it")
        path.unlink()

    def restore_vocabulary(self, log=print) -> None:
        """A resumed run whose vocabulary file is gone (deleted, lost in a copy): every training checkpoint carries
        the vocabulary it was trained with, so the file is written back from the newest checkpoint that holds it
        (its sha256 checked against the one the checkpoint recorded), and said in one line. Preparation must never
        train another vocabulary into the run and re-encode its prepared corpus with it (issue 68: it did, then
        refused). No checkpoint holding one: one line, before anything is written."""
        if run_file_names.run_vocab(self.path).exists() or not self.checkpoints():
            return
        for path in reversed(self.checkpoints()):
            try:
                ck = load_checkpoint(path, with_optimizer=False)
            except CheckpointError:
                continue
            if not ck.vocab or ck.meta.get("vocab_sha256") not in (None, hashlib.sha256(ck.vocab).hexdigest()):
                continue
            name = run_file_names.MARIAN_VOCAB if is_marian_vocab_bytes(ck.vocab) else run_file_names.VOCAB
            atomic_write_bytes(self.path / name, ck.vocab)
            log(f"vocabulary: {shown(self.path / name)} was missing: restored from {shown(path)} (every checkpoint "
                "carries the vocabulary it was trained with)")
            return
        raise CheckpointError(f"{shown(run_file_names.run_vocab(self.path))} is missing and no checkpoint in "
                              f"{shown(self.checkpoint_dir)} carries the vocabulary: restore the file from a copy of the "
                              "run, or start a new run with another --out (nothing was changed)")

    def _refuse_a_foreign(self, path: Path, meta: dict, model_config: dict, vocab_sha256: str, others) -> None:
        """A checkpoint copied in from another run (its data source is not this run's, or its vocabulary or model
        differ from this run's while the run's other checkpoints agree with it) is named as such, with the advice
        that fits: take it out. Telling the user to restore spm.model would send them after a vocabulary that is
        intact (issue 68)."""
        ours, theirs = (self.read_settings() or {}).get("data"), meta.get("data")

        def fits(m) -> bool:
            return m.get("vocab_sha256") in (None, vocab_sha256) and _comparable(m.get("model_config")) == \
                _comparable(model_config)
        if fits(meta) and (not ours or not theirs or ours == theirs):
            return
        agree = []
        for other in others:
            try:
                agree.append(fits(read_meta(other)))
            except CheckpointError:
                continue
        if (ours and theirs and ours != theirs) or any(agree):
            why = (f"trained on {theirs}, this run on {ours}" if ours and theirs and ours != theirs else
                   "its vocabulary or model differs from this run's, which its other checkpoints share")
            raise CheckpointError(f"{shown(path)} is a checkpoint of another run ({why}): move it out of "
                                  f"{shown(self.checkpoint_dir)} (or remove it), then resume: this run's own "
                                  "checkpoints and vocabulary are intact")

    # -- checkpoints --------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """The run's checkpoint files, oldest first."""
        return run_file_names.run_checkpoints(self.path)

    def preflight(self, checkpoint_bytes: int, keep_last: int) -> None:
        """Fail now, in one line, if the folder cannot hold the checkpoints (not after an hour).

        The checkpoint folder must be writable, and the disk must have room for what training will
        add: up to ``keep_last`` checkpoints of ``checkpoint_bytes`` plus the one being written, and the
        average (the weights, a third of a checkpoint), with 10% to spare.
        """
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.checkpoint_dir, prefix=partial_prefix("write-probe"))
            with os.fdopen(fd, "wb") as f:
                f.write(b"numformer")
                f.flush()
            os.unlink(probe)
        except OSError as exc:
            raise CheckpointError(f"cannot write to {self.checkpoint_dir}: {exc.strerror or exc}: "
                                  "choose another --out or fix the folder's permissions") from None
        weights = (checkpoint_bytes - (1 << 20)) // 3
        need = max(1, keep_last + 1 - len(self.checkpoints())) * checkpoint_bytes
        if not (self.path / run_file_names.AVERAGED).exists():
            need += weights
        need = int(need * 1.1)
        free = shutil.disk_usage(self.checkpoint_dir).free
        if free < need:
            mb = 1 << 20
            raise CheckpointError(
                f"not enough free disk space for {self.checkpoint_dir}: {keep_last} checkpoints of "
                f"{checkpoint_bytes / mb:.0f} MB (weights and Adam moments) and their average need about "
                f"{need / mb:.0f} MB, {free / mb:.0f} MB are free: free some space, lower --keep-last or choose "
                "another --out")

    def save_checkpoint(self, step: int, model_state: dict, meta: dict, optimizer_state: dict, vocab: bytes,
                        keep_last: int) -> Path:
        """Write the checkpoint of ``step`` (atomically), then delete all but the newest ``keep_last``.

        A failed write (a full disk) is a one-line CheckpointError naming the previous checkpoint,
        which is intact."""
        path = run_file_names.step_checkpoint_path(self.path, step)
        try:
            save_checkpoint(path, model_state, meta, optimizer_state, vocab=vocab)
        except OSError as exc:
            previous = self.checkpoints()
            kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no checkpoint was written"
            raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}: {kept}; free disk space "
                                  "or fix the folder, then continue with --resume") from None
        for old in self.checkpoints()[:-keep_last]:
            try:
                old.unlink()
            except OSError:
                pass
        return path

    def holds_checkpoint_of(self, step: int) -> bool:
        found = self.checkpoints()
        return bool(found) and found[-1] == run_file_names.step_checkpoint_path(self.path, step)

    def resumable_checkpoint(self, model_config: dict, vocab_sha256: str, log=print) -> tuple[Checkpoint, Path] | None:
        """The newest readable checkpoint, checked to continue this run; None when there is none.

        Leftover temporary files of a killed write are deleted; an unreadable checkpoint is renamed to
        ``*.corrupt`` (so nothing picks it up again) and the next older one is used. A checkpoint of
        another model config (``model_config``: ``ModelConfig.to_dict()``) or vocabulary, or one
        without training state, is a one-line CheckpointError.
        """
        for folder in (self.path, self.checkpoint_dir):
            sweep_stale_partials(folder)  # says what it removed, in one line
        found = self.checkpoints()
        if not found:
            return None
        ck = None
        for path in reversed(found):
            try:
                ck = load_checkpoint(path)
                break
            except CheckpointError as exc:
                bad = path.with_name(path.name + ".corrupt")
                try:
                    path.rename(bad)
                    log(f"skipping unreadable checkpoint (renamed to {bad.name}): {exc}")
                except OSError:
                    log(f"skipping unreadable checkpoint: {exc}")
        if ck is None:
            raise CheckpointError(f"no readable checkpoint in {self.checkpoint_dir}: remove the folder or start "
                                  "without --resume")
        self._refuse_a_foreign(path, ck.meta, model_config, vocab_sha256, [p for p in found if p != path])
        saved, now = ck.meta.get("model_config"), dict(model_config)
        if isinstance(saved, dict):  # how the weights were first drawn does not matter once they are loaded
            saved = {k: v for k, v in saved.items() if k not in INIT_ONLY_FIELDS}
            now = {k: v for k, v in now.items() if k not in INIT_ONLY_FIELDS}
        if saved != now:
            if not isinstance(saved, dict):
                raise CheckpointError(f"{path} has no model config: it is not a numformer training checkpoint")
            differ = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
            recorded = self._model_settings_read_back()
            if differ and all(k in recorded and recorded[k] == now.get(k) for k in differ):  # no flag asked it
                settings = self.path / run_file_names.SETTINGS
                values = ", ".join(f"model_config.{k} is {now.get(k)!r} (trained: {saved.get(k)!r})"
                                   for k in differ[:4])
                raise CheckpointError(f"{settings}'s {values}: {path} was trained with the other values: correct "
                                      "that file to them and resume again")
            diff = [f"{k} {saved.get(k)!r} (asked: {now.get(k)!r})" for k in differ]
            vocab_file = run_file_names.run_vocab(self.path)
            if differ == ["vocab_size"]:  # the run's vocabulary file replaced by one of another size
                raise CheckpointError(f"{path} was trained with a vocabulary of {saved.get('vocab_size')} pieces, "
                                      f"{vocab_file} has {now.get('vocab_size')}: {_RESTORE.format(vocab_file.name)}")
            preset = self._preset_read_back()
            if preset is not None and not set(differ) & _FLAG_FIELDS:  # the preset's own sizes: run.json's preset
                raise CheckpointError(f"{self.path / run_file_names.SETTINGS}'s preset is {preset!r}, whose model is "
                                      f"not the one {path} was trained with ({', '.join(diff[:4])}): correct that "
                                      "file's preset to the run's and resume again")
            raise CheckpointError(f"{path} was trained with another model: {', '.join(diff[:4])}: resume with the "
                                  "run's --preset and model flags (or leave them out to use the run's)")
        expected = ck.meta.get("vocab_sha256")
        if expected and expected != vocab_sha256:
            vocab_file = run_file_names.run_vocab(self.path)
            raise CheckpointError(f"{path} was trained with another vocabulary than {vocab_file}: "
                                  f"{_RESTORE.format(vocab_file.name)}")
        if ck.optimizer is None or not all(k in ck.meta for k in ("rng", "epoch", "batch_pos", "elapsed")):
            raise CheckpointError(f"{path} holds no training state (optimizer, data position): it cannot be "
                                  "resumed, only translated with")
        return ck, path

    def average(self, last: int) -> Path | None:
        """Average the newest ``last`` checkpoints into ``averaged.npz``; None when there are fewer than 2."""
        paths = self.checkpoints()[-last:]
        if len(paths) < 2:
            return None
        ck = average_checkpoints(paths)
        path = self.path / run_file_names.AVERAGED
        save_checkpoint(path, ck.model, ck.meta, vocab=ck.vocab)
        return path

    # -- metrics ------------------------------------------------------------------------------------------
    def append_metrics(self, record: dict) -> None:
        """One line of ``metrics.jsonl``."""
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_metrics(self, step: int) -> None:
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
        atomic_write_bytes(self.metrics_path, data)



def _flag_fields() -> frozenset:
    from .model_flags import MODEL_FLAGS  # noqa: PLC0415  (the table of model flags, beside this module)

    return frozenset(f.field for f in MODEL_FLAGS) | {"vocab_size", "pad_id"}


_FLAG_FIELDS = _flag_fields()  # model settings a flag or the vocabulary sets, not the preset alone


def _comparable(config):
    """A model config as two runs of one model share it (how the weights were first drawn aside)."""
    if not isinstance(config, dict):
        return config
    return {k: v for k, v in config.items() if k not in INIT_ONLY_FIELDS}
