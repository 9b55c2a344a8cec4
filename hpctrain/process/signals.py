"""Stop requests from signals, agreed on by every rank at a step boundary.

A handler only records the request. At step boundaries the ranks all-reduce it (`agreed()`, or
hpctrain.trainer.stop_vote without stalling a step), so every rank stops after the same step,
saves collectively and exits with a code the batch script reads.
Never checkpoint inside the handler: it may interrupt a collective.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

from hpctrain.dist.context import DistContext
from hpctrain.run.causes import StopReason
from hpctrain.run.exitcodes import WORKER_SAVED_AND_STOPPED, WORKER_SAVED_FOR_TIMELIMIT

_REASONS = {reason.urgency: reason for reason in StopReason}


class StopFlag:
    def __init__(self, timelimit_signal: str = "USR2") -> None:
        self.requested = 0
        # When the first request came (time.monotonic()): a forced save's deadline counts from it.
        self.requested_at: float | None = None
        self.signal_names = {
            getattr(signal, f"SIG{timelimit_signal}"): StopReason.TIMELIMIT,
            signal.SIGTERM: StopReason.PREEMPT,
            signal.SIGINT: StopReason.INTERRUPT,
        }

    def install(self) -> None:
        for signum in self.signal_names:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.note(signum, time.monotonic())

    def note(self, signum: int, arrived_at: float) -> None:
        """A stop signal that arrived at `arrived_at` (time.monotonic()); also one held before
        the handlers were installed (hpctrain.process.early_signals)."""
        self.requested = max(self.requested, self.signal_names[signum].urgency)
        if self.requested_at is None or arrived_at < self.requested_at:
            self.requested_at = arrived_at

    def agreed_alone(self) -> StopReason | None:
        """This process's own request, before there is a group to agree with."""
        return self.reason_for(self.requested)

    def agreed(self, ctx: DistContext) -> StopReason | None:
        """Collective: the stop reason every rank agrees on, or None to go on."""
        if ctx.distributed:
            # int32: supported by every backend's MAX reduction, unlike bool.
            flag = torch.tensor([self.requested], dtype=torch.int32, device=ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            code = int(flag.item())
        else:
            code = self.requested
        return self.reason_for(code)

    @staticmethod
    def reason_for(code: int) -> StopReason | None:
        return _REASONS.get(code)


def exit_code(reason: StopReason) -> int:
    """A training process's exit code after a save forced by `reason` (hpctrain.run.exitcodes)."""
    return WORKER_SAVED_FOR_TIMELIMIT if reason == StopReason.TIMELIMIT else WORKER_SAVED_AND_STOPPED
