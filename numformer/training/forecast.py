"""How long the whole run will take, said once, from the first steps measured on this machine.

The paper's base model trains 100k steps and big 300k (Section 5.2): on one CPU that is months, on
one GPU days. Before anyone waits for it, the trainer says what this device makes of it, one line
after the first few steps::

    base on this device (cpu): ~1,350 h for 100,000 steps (48.6 s a step over steps 2-6; 24,310 source
    + 24,870 target tokens a step in 2 accumulated batches)

The first step of a process is left out of the measurement (it allocates the buffers and warms the
BLAS up); the next ``MEASURED`` steps are averaged. A run shorter than that is measured over what it
has. With a time budget instead of a step budget the line says how many steps fit in it.
"""
from __future__ import annotations

#: Steps averaged for the forecast, after the first one.
MEASURED = 5


class StepTimeForecast:
    """Collects the first steps' times and token counts; :meth:`add` returns the forecast line once.

    name: what is trained (the preset); device: ``cpu`` or ``cuda``; start_step: the optimizer step
    training starts from (a resumed run forecasts what is left); max_steps / max_minutes: the budget.
    """

    def __init__(self, name: str, device: str, start_step: int, max_steps: int | None, max_minutes: float | None,
                 accum: int):
        self.name, self.device, self.accum = name, device, accum
        self.start_step, self.max_steps, self.max_minutes = start_step, max_steps, max_minutes
        self.seen = 0
        self.seconds = 0.0
        self.src_tokens = self.tgt_tokens = 0
        self.measured: list[int] = []
        self.said = False

    def add(self, step: int, seconds: float, src_tokens: int, tgt_tokens: int) -> str | None:
        """Record one optimizer step; the forecast line when enough steps are measured (or the budget
        ends first), once; None otherwise."""
        if self.said:
            return None
        self.seen += 1
        last = self.max_steps is not None and step >= self.max_steps
        if self.seen > 1 or last:  # the first step warms up, unless it is all there is
            self.seconds += seconds
            self.src_tokens += src_tokens
            self.tgt_tokens += tgt_tokens
            self.measured.append(step)
        if len(self.measured) < MEASURED and not last:
            return None
        self.said = True
        return self.line()

    def line(self) -> str:
        """The forecast from the steps measured so far."""
        n = len(self.measured)
        per_step = self.seconds / n
        steps = (f"step {self.measured[0]}" if n == 1 else f"steps {self.measured[0]}-{self.measured[-1]}")
        measured = (f"{per_step:.2f} s a step over {steps}; {self.src_tokens / n:,.0f} source + "
                    f"{self.tgt_tokens / n:,.0f} target tokens a step in {self.accum} accumulated "
                    f"batch{'es' if self.accum > 1 else ''}")
        if self.max_steps is not None:
            left = max(self.max_steps - self.start_step, 0)
            return (f"{self.name} on this device ({self.device}): ~{_hours(left * per_step)} for {left:,} "
                    f"{'more ' if self.start_step else ''}steps ({measured})")
        fit = int(60 * self.max_minutes / per_step)
        return (f"{self.name} on this device ({self.device}): ~{fit:,} steps in {self.max_minutes:g} min "
                f"({measured})")


def _hours(seconds: float) -> str:
    """``N h`` (seconds under a minute, minutes under an hour, days too past four)."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 4 * 86400:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 3600:,.0f} h ({seconds / 86400:,.1f} days)"
