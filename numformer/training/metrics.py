"""The training log: what the steps since the last log line add up to, and the record written for them.

Every ``--log-every`` good steps the trainer writes one record to ``RUN/metrics.jsonl`` (and to
TensorBoard when that is on): the mean training loss of the steps since the last record, the
learning rate of Eq. 3, the gradient norm, the speed in tokens per second, the clock and the epoch.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass


@dataclass
class LogWindow:
    """The steps since the last log line: tokens seen, seconds spent, the sum of their losses, good steps.

    Checkpoints keep it (as a list of the four numbers, ``log_window``), so the first log line after a
    resume averages the same steps an uninterrupted run would.
    """

    tokens: int = 0
    seconds: float = 0.0
    loss_sum: float = 0.0
    good_steps: int = 0

    def add_time(self, tokens: int, seconds: float) -> None:
        """Every step, good or not: its tokens and time count towards the speed."""
        self.tokens += tokens
        self.seconds += seconds

    def add_loss(self, loss: float) -> None:
        """A good step: its loss counts towards the mean."""
        self.loss_sum += loss
        self.good_steps += 1

    def to_list(self) -> list:
        return list(astuple(self))

    @classmethod
    def from_list(cls, values) -> "LogWindow":
        """From a checkpoint's ``log_window`` (an empty window when it is missing or malformed)."""
        return cls(*values) if isinstance(values, list) and len(values) == 4 else cls()


def train_record(step: int, window: LogWindow, lr: float, grad_norm: float, elapsed: float, epoch: int) -> dict:
    """The metrics record of a log line: mean loss of the window, learning rate, gradient norm, speed."""
    return {"step": step, "train_loss": window.loss_sum / window.good_steps, "lr": lr,
            "grad_norm": float(grad_norm), "tokens_per_s": window.tokens / max(window.seconds, 1e-9),
            "elapsed": round(elapsed, 2), "epoch": epoch}
