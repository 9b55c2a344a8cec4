"""The trainer's part of a stop: the ranks agree on it at a step boundary (hpctrain.trainer.stop_vote),
journal it, save under the time the signal gives, and leave training by StopTraining.

What each stop's signal, deadline, exit code and cause are: hpctrain.run.causes.STOP_TABLE.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from hpctrain.checkpoint import Checkpointer
from hpctrain.checkpoint.deadline import SigtermTimesReading, deadline_s, preempted_now, sigterm_s
from hpctrain.config import Config
from hpctrain.dist.context import DistContext
from hpctrain.run.causes import STOP_TABLE, Grace, StopReason
from hpctrain.run.events import Journal, Stop
from hpctrain.trainer.hooks import SAVE, ProcessHooks
from hpctrain.trainer.stop_vote import StopVote


class StopTraining(Exception):
    """Raised after a signal-forced checkpoint."""

    def __init__(self, reason: StopReason, step: int) -> None:
        super().__init__(f"stopped at step {step}: {reason}")
        self.reason = reason
        self.step = step


class Stopping:
    def __init__(
        self, hooks: ProcessHooks, ctx: DistContext, config: Config, journal: Journal, checkpointer: Checkpointer
    ) -> None:
        self.hooks = hooks
        self.ctx = ctx
        self.signal_delay_s = config.slurm.signal_delay_s
        self.journal = journal
        self.checkpointer = checkpointer
        self.vote = StopVote(hooks.stop, ctx)
        # What a SIGTERM gives for the forced save (GraceTime, KillWait): read once, beside the
        # start rather than before it, so a start never waits for Slurm to answer.
        self.sigterm_times = SigtermTimesReading() if ctx.is_main else None

    def start(self, step: int) -> None:
        """Training starts (or resumes) at `step`: the first vote begins."""
        self.vote.start(step)

    def poll(self, step: int) -> StopReason | None:
        """At a step boundary: the stop every rank agreed on, or None to go on."""
        return self.vote.poll(step)

    def requested(self) -> bool:
        """A stop signal came (to this rank), agreed on or not yet."""
        return self.hooks.stop.requested > 0

    def save_and_stop(self, reason: StopReason, step: int, state: dict[str, Any]) -> NoReturn:
        """The ranks agreed to stop after `step`: the `stop` record, then the save the stop forces,
        bounded by the time the signal gives (rank 0's view); then StopTraining."""
        sigterm_given_s = self._sigterm_given_s(reason)  # may ask Slurm: counted in the time since the signal
        since_signal_s = time.monotonic() - (self.hooks.stop.requested_at or time.monotonic())
        deadline = deadline_s(reason, since_signal_s, self.signal_delay_s, sigterm_given_s)
        # Before the save: a save killed half-way (a deadline missed, SIGKILL) writes nothing, and
        # the control step must still learn that the ranks had agreed to stop, and why.
        self.journal.write_event(
            Stop(
                job_id=self.ctx.life.job_id,
                restart=self.ctx.life.restart,
                step=step,
                reason=reason,
                deadline_s=None if deadline is None else round(deadline, 2),
                since_signal_s=round(since_signal_s, 3),
            )
        )
        self.hooks.watchdog.beat(SAVE)  # a save is no step: trainer.save_timeout_s, not a step's timeout
        self.checkpointer.forced_save(step, state, reason, deadline)
        self.hooks.watchdog.beat()
        raise StopTraining(reason, step)

    def _sigterm_given_s(self, reason: StopReason) -> float:
        """What a SIGTERM gives before Slurm's SIGKILL (0 for another stop, or on ranks > 0):
        a preemption's grace or KillWait, Slurm asked which only when the two differ."""
        if STOP_TABLE[reason].grace is not Grace.SIGTERM or self.sigterm_times is None:
            return 0.0
        times = self.sigterm_times.get()
        return sigterm_s(times, preempted_now() if times.preemption_differs else False)
