"""What a run folder holds, by name: every module that reads or writes one of these files asks here.

::

    RUN/run.json              the run's settings (train.py writes them; --resume reads them back)
    RUN/run.lock              the lock that keeps the folder to one process
    RUN/spm.model             the shared sentencepiece vocabulary
    RUN/marian.vocab          instead, a Marian vocabulary (train.py --init-from an imported opus-mt model)
    RUN/prepared/             the encoded corpus, memory-mapped (numformer.prepare)
    RUN/checkpoints/step_0001234.npz   a training checkpoint (weights, Adam, data position)
    RUN/averaged.npz          the average of the last checkpoints (Section 6.1)
    RUN/metrics.jsonl         one JSON record per log line or validation
    RUN/grad_stats.jsonl      per-tensor gradient statistics (--log-grads N)
    RUN/decoding.json         the length penalty chosen on the validation split (numformer.decoding.valid_choice)
    RUN/test.hyp              the test set's translations; RUN/test_scores.json their scores
    RUN/crash.log             the traceback of a bug (the one-line message names it)
"""
from __future__ import annotations

from pathlib import Path

SETTINGS = "run.json"
LOCK = "run.lock"
VOCAB = "spm.model"
MARIAN_VOCAB = "marian.vocab"
PREPARED = "prepared"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged.npz"
METRICS = "metrics.jsonl"
GRAD_STATS = "grad_stats.jsonl"
DECODING = "decoding.json"
TEST_HYPOTHESES = "test.hyp"
TEST_SCORES = "test_scores.json"
CRASH_LOG = "crash.log"


def run_vocab(run_dir) -> Path:
    """The run's vocabulary file: ``marian.vocab`` where a fine-tuned Marian model left one, else ``spm.model``."""
    marian = Path(run_dir) / MARIAN_VOCAB
    return marian if marian.is_file() else Path(run_dir) / VOCAB


def step_checkpoint_path(run_dir, step: int) -> Path:
    """Where a run keeps the checkpoint of optimizer step ``step`` (zero-padded: names sort by step)."""
    return Path(run_dir) / CHECKPOINTS / f"step_{int(step):07d}.npz"


def run_checkpoints(run_dir) -> list[Path]:
    """A run's training checkpoints, oldest first."""
    return sorted((Path(run_dir) / CHECKPOINTS).glob("step_*.npz"))
