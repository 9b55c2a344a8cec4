"""What the training process lends its trainer (hpctrain.process.life builds it): the stop its
signal handlers record, its watchdog, and its start-up clock.

Typed here as what the trainer uses of them, so the trainer imports nothing of hpctrain.process,
the folder that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class StopRequests(Protocol):
    """The stop the signal handlers recorded (hpctrain.process.signals.StopFlag)."""

    requested: int  # the most urgent stop asked for (StopReason.urgency); 0: none
    requested_at: float | None  # when the first came (time.monotonic()): a forced save's deadline counts from it


class Heartbeat(Protocol):
    """The watchdog (hpctrain.process.watchdog): a process that stops beating is a hang."""

    def beat(self, phase: str | None = None) -> None:
        """Progress that is not a step (an evaluation, a save, a stage of the start done), and
        the phase that begins (hpctrain.process.watchdog's FIRST_STEP, EVALUATION, SAVE)."""
        ...

    def stepped(self) -> None:
        """A training step done (its time teaches the watchdog how long a step may take)."""
        ...

    def stop(self) -> None:
        """Training is over: no beat will come any more."""
        ...


@dataclass(frozen=True)
class ProcessHooks:
    stop: StopRequests
    watchdog: Heartbeat
    # Called once, when the trainer is ready to train (the model built, the checkpoint loaded):
    # the start-up's phases in seconds, for the `start` record (hpctrain.process.startup_clock).
    ready: Callable[[], dict[str, float]]
