"""How many trials to submit now: a pure function of the study's counts and the budgets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    running: int = 0  # asked and not told: queued or training
    complete: int = 0
    pruned: int = 0
    failed: int = 0

    @property
    def ended(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def total(self) -> int:
        return self.running + self.ended


def to_submit(counts: Counts, n_trials: int, parallel: int) -> int:
    """As many as keep `parallel` trials running without exceeding `n_trials` in all (running
    and ended: a failed trial spends budget too, so a search that keeps failing ends)."""
    return max(0, min(parallel - counts.running, n_trials - counts.total))


def finished(counts: Counts, n_trials: int) -> bool:
    """The study is over: every trial of the budget was asked and none is running."""
    return counts.running == 0 and counts.total >= n_trials
