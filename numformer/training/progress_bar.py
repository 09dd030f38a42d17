"""The training progress bar: how much of the budget (``--max-minutes`` and/or ``--max-steps``) is spent.

The bar fills with the larger of the two fractions spent (training stops at whichever ends first);
its text says the step, the minutes of training so far and how many are left, e.g.
``step 1200/3000 | 10.1 min elapsed, ~15.2 min left (25 min budget)``. Minutes are training time as
the trainer counts it (validation excluded, earlier attempts of a resumed run included), so the bar
agrees with ``--max-minutes``; with a step budget alone the minutes left are estimated from the
speed since the bar started.
"""
from __future__ import annotations

import time


def budget_fraction(step: int, elapsed: float, max_steps: int | None, max_minutes: float | None) -> float:
    """The spent share of the budget, in [0, 1]: the larger of steps/max_steps and minutes/max_minutes."""
    parts = []
    if max_steps:
        parts.append(step / max_steps)
    if max_minutes:
        parts.append(elapsed / (60.0 * max_minutes))
    return min(1.0, max(parts, default=0.0))


def budget_text(step: int, elapsed: float, max_steps: int | None, max_minutes: float | None,
                seconds_per_step: float | None = None) -> str:
    """``step S[/N] | M min elapsed, L min left (...)`` for the bar; ``seconds_per_step`` (measured
    since the bar started) estimates the time left of a step budget."""
    head = f"step {step}/{max_steps}" if max_steps else f"step {step}"
    spent = f"{elapsed / 60:.1f} min elapsed"
    left = []
    if max_minutes:
        left.append(max(0.0, 60.0 * max_minutes - elapsed))
    if max_steps and seconds_per_step:
        left.append(max(0, max_steps - step) * seconds_per_step)
    if not left:
        return f"{head} | {spent}"
    exact = bool(max_minutes) and (not max_steps or not seconds_per_step or left[0] <= left[-1])
    budget = " and ".join(x for x in (f"{max_minutes:g} min" if max_minutes else "",
                                       f"{max_steps} steps" if max_steps else "") if x)
    return f"{head} | {spent}, {'' if exact else '~'}{min(left) / 60:.1f} min left ({budget} budget)"


class BudgetBar:
    """A tqdm bar over the budget, in thousandths, with :func:`budget_text` as its description."""

    SCALE = 1000

    def __init__(self, max_steps, max_minutes, step: int, elapsed: float):
        from tqdm import tqdm  # noqa: PLC0415

        self.max_steps, self.max_minutes = max_steps, max_minutes
        self.start_step, self.start_time = step, time.perf_counter()
        self.bar = tqdm(total=self.SCALE, dynamic_ncols=True, mininterval=1.0,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix}")
        self.update(step, elapsed)

    def update(self, step: int, elapsed: float, **postfix) -> None:
        done = step - self.start_step
        rate = (time.perf_counter() - self.start_time) / done if done > 0 else None
        self.bar.set_description_str(budget_text(step, elapsed, self.max_steps, self.max_minutes, rate),
                                     refresh=False)
        if postfix:
            self.bar.set_postfix(refresh=False, **postfix)
        self.bar.update(round(self.SCALE * budget_fraction(step, elapsed, self.max_steps, self.max_minutes))
                        - self.bar.n)

    def close(self) -> None:
        self.bar.close()
