"""What the training process lends its trainer (hpctrain.process.life builds it): the stop its
signal handlers record, its watchdog, and its start-up clock.

Typed here as what the trainer uses of them, so the trainer imports nothing of hpctrain.process,
the folder that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# The phases a watchdog beat can begin (Heartbeat.beat), each with its own timeout, the trainer
# key that sets it (hpctrain.process.step_timeout.phase_timeouts): what comes after a beat of no
# phase (a stage of the start, the steps after an evaluation or a save) waits
# trainer.hang_timeout_s.
FIRST_STEP, EVALUATION, SAVE = "first_step", "evaluation", "save"
# Not a phase of its own: a save (or an evaluation) in the middle of training is done and steps
# follow, each waited for as long as any step (the learned timeout). A hang right after a periodic
# save once waited the whole trainer.hang_timeout_s (a rank stopped 14 ms after its save at step
# 80 went unnoticed for 12 minutes).
STEPS_FOLLOW = "steps_follow"
PHASE_KEYS = {
    FIRST_STEP: "first_step_timeout_s",  # a life's first step: torch.compile, caches warming
    EVALUATION: "eval_timeout_s",
    SAVE: "save_timeout_s",
}


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
    # What the node checks measured before training (hpctrain.process.node_health), for `start`.
    health: dict[str, float] | None = None
