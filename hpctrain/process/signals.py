"""Stop requests from signals: where a training process's SIGTERM, Ctrl-C or time-limit warning lands.

A handler only records the request. At step boundaries the ranks all-reduce it
(hpctrain.trainer.stop_vote, without stalling a step), so every rank stops after the same step,
saves collectively (hpctrain.trainer.stopping) and exits with the stop's code, which the batch
script reads. Which signal is which stop, and what each stop leads to: hpctrain.run.causes.STOP_TABLE.
Never checkpoint inside the handler: it may interrupt a collective.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

from hpctrain.run.causes import STOP_TABLE, StopReason, signal_of, stop_of_urgency


class StopFlag:
    def __init__(self, timelimit_signal: str = "USR2") -> None:
        self.requested = 0  # the most urgent stop asked for (StopReason.urgency); 0: none
        # When the first request came (time.monotonic()): a forced save's deadline counts from it.
        self.requested_at: float | None = None
        self.signal_names = {signal_of(reason, timelimit_signal): reason for reason in STOP_TABLE}

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
        return stop_of_urgency(self.requested)
