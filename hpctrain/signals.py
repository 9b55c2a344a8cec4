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

from hpctrain.dist import DistContext
from hpctrain.exitcodes import EXIT_REQUEUE, EXIT_STOPPED

# Larger wins when ranks saw different signals.
_CODES = {"timelimit": 1, "preempt": 2, "interrupt": 3}
_REASONS = {code: reason for reason, code in _CODES.items()}


class StopFlag:
    def __init__(self, timelimit_signal: str = "USR2") -> None:
        self.requested = 0
        # When the first request came (time.monotonic()): a forced save's deadline counts from it.
        self.requested_at: float | None = None
        self.signal_names = {
            getattr(signal, f"SIG{timelimit_signal}"): "timelimit",
            signal.SIGTERM: "preempt",
            signal.SIGINT: "interrupt",
        }

    def install(self) -> None:
        for signum in self.signal_names:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = max(self.requested, _CODES[self.signal_names[signum]])
        if self.requested_at is None:
            self.requested_at = time.monotonic()

    def agreed(self, ctx: DistContext) -> str | None:
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
    def reason_for(code: int) -> str | None:
        return _REASONS.get(code)


def exit_code(reason: str) -> int:
    return EXIT_REQUEUE if reason == "timelimit" else EXIT_STOPPED
