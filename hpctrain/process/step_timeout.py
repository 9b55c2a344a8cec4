"""How long the hang watchdog waits for the next step: learned from the steps a life has taken.

One timeout for every phase (`trainer.hang_timeout_s`, 900 s by default) has to fit the longest
of them: a start-up on a slow filesystem, a first step that compiles, a whole evaluation, a
checkpoint write. In steady state a step takes seconds, and a rank stuck in a deadlock or a
kernel call (its node alive, its heartbeat beater beating on) kept the job idle for those 900 s.
So once a life has taken enough ordinary steps, the wait for the next one is
max(`trainer.step_hang_timeout_s`, FACTOR x the recent steps' 90th percentile), never more than
`trainer.hang_timeout_s`; after anything that is not a step (the start, an evaluation, a save)
the whole `trainer.hang_timeout_s` again, unless it is a save or an evaluation in the middle of
training that is over (`steps_follow`): the step after it waits the learned timeout as any step.
NVIDIA's resiliency extension learns its timeouts from observed step times the same way; its
default step section is 60 s.

A pure decision over times, tested as a table (tests/test_step_timeout.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# The phases a watchdog beat can begin: the trainer's words for them.
from hpctrain.trainer.hooks import EVALUATION, FIRST_STEP, SAVE

if TYPE_CHECKING:
    from hpctrain.config.schema import TrainerConfig

# A life's first step when trainer.first_step_timeout_s is null: long enough for torch.compile of
# a large model, kept a minute below the collective timeout (a peer stopped in it is a hang).
FIRST_STEP_DEFAULT_S = 1500.0
COLLECTIVE_MARGIN_S = 60.0


def phase_timeouts(trainer: TrainerConfig) -> dict[str, float]:
    """Each phase's timeout from the trainer keys (PHASE_KEYS); a phase left out waits
    hang_timeout_s. A first step left null waits hang_timeout_s too, unless the model compiles
    (trainer.compile): then FIRST_STEP_DEFAULT_S (or hang_timeout_s, if longer), below the
    collective timeout."""
    first: float | None = trainer.first_step_timeout_s
    if first is None and trainer.compile:
        ceiling = min(FIRST_STEP_DEFAULT_S, trainer.collective_timeout_s - COLLECTIVE_MARGIN_S)
        first = max(trainer.hang_timeout_s, ceiling)
    chosen = {FIRST_STEP: first, EVALUATION: trainer.eval_timeout_s, SAVE: trainer.save_timeout_s}
    return {phase: float(seconds) for phase, seconds in chosen.items() if seconds}


WARMUP_STEPS = 10  # a life's first steps (compiling, caches warming, a resumed loader) are not counted
MIN_SAMPLES = 20  # ordinary steps seen before a timeout is learned
WINDOW = 200  # the recent steps the percentile is taken over
FACTOR = 10.0  # a step this many times longer than the recent slow ones is no longer a slow step


def p90(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


@dataclass
class StepTimeout:
    """The watchdog's timeout, from the beats it was given: `stepped` after a training step,
    `other` after anything else that counts as progress (a stage of the start, an evaluation, a save)."""

    cap_s: float  # trainer.hang_timeout_s
    floor_s: float  # trainer.step_hang_timeout_s; 0: never learned, always cap_s
    _steps: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _stepped: int = 0  # step-to-step intervals seen this life, the warm-up's included
    _last_was_step: bool = False
    _last_at: float | None = None
    _phase_s: float | None = None  # the timeout of the phase the last `other` began; None: cap_s
    _phase_key: str = ""  # the trainer key that set it (hpctrain.trainer.hooks.PHASE_KEYS)
    _steps_follow: bool = False  # the last `other` ended a save or evaluation between steps

    def stepped(self, now: float) -> None:
        if self._last_was_step and self._last_at is not None:
            self._stepped += 1
            if self._stepped > WARMUP_STEPS:
                self._steps.append(now - self._last_at)
        self._last_was_step, self._last_at = True, now

    def other(self, now: float, phase_s: float | None = None, key: str = "", steps_follow: bool = False) -> None:
        """Progress that is no step; `phase_s`: how long what comes next may take (a first step
        that compiles, an evaluation, a save), set by the trainer key `key`; else cap_s.
        `steps_follow`: a save or an evaluation between steps is over, and the next step is waited
        for as any step (the learned timeout, once there is one); the time until it is no step's."""
        self._last_was_step, self._last_at, self._phase_s, self._phase_key = False, now, phase_s, key
        self._steps_follow = steps_follow

    def source(self) -> str:
        """What set the timeout now in force, for the hang's one line: the key to change."""
        learned = self.learned_s()
        if (self._last_was_step or self._steps_follow) and learned is not None:
            return f"{learned:.0f} s learned from this life's steps, trainer.step_hang_timeout_s={self.floor_s:g}"
        if not self._last_was_step and self._phase_s:
            return f"trainer.{self._phase_key}={self._phase_s:g}"
        return f"trainer.hang_timeout_s={self.cap_s:g}"

    def learned_s(self) -> float | None:
        """The steady-state timeout, once enough ordinary steps were seen; else None."""
        if self.floor_s <= 0 or len(self._steps) < MIN_SAMPLES:
            return None
        return min(self.cap_s, max(self.floor_s, FACTOR * p90(list(self._steps))))

    def timeout_s(self) -> float:
        """How long the next step may be waited for: the learned timeout right after a step,
        trainer.hang_timeout_s after anything else."""
        learned = self.learned_s()
        if self._last_was_step or self._steps_follow:
            return learned if learned is not None else self.cap_s
        return self._phase_s if self._phase_s else self.cap_s
