"""Signals that arrive before a training process can act on them.

A preemption can land while a task is still importing torch (a second or more at every start,
right after a backfill start is when preemptions are common). Python's default action for
SIGTERM kills the process (exit 143) and the control step could only call that a crash. So the
worker's first act, before any heavy import, is to hold every signal a stop can come as: each is
only recorded. Once the config says which signal is the time-limit warning, `hand_over` gives the
stop signals to the StopFlag (their arrival time too: a deadline counts from it) and re-raises
any other one with its default action, as if it had never been held.

Imports nothing heavy: it must be installed in a moment.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from types import FrameType

# Every signal a stop or the time-limit warning may come as (slurm.signal's choices, TERM, INT).
HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGURG)


class EarlySignals:
    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []  # (signal, time.monotonic()) in order
        self._previous: dict[int, object] = {}

    def hold(self) -> EarlySignals:
        for signum in HELD:
            self._previous[signum] = signal.signal(signum, self._record)
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append((signum, time.monotonic()))

    def hand_over(self, handled: set[int], handle: Callable[[int, float], None]) -> None:
        """Call once the real handlers are installed for `handled`: each held signal among them
        goes to `handle(signum, arrived_at)`; any other held signal gets back its previous
        handler and is raised again (HUP kills, URG does nothing, as they would have)."""
        for signum, previous in self._previous.items():
            if signum not in handled:
                signal.signal(signum, previous)  # type: ignore[arg-type]
        for signum, arrived_at in self.received:
            if signum in handled:
                handle(signum, arrived_at)
            else:
                os.kill(os.getpid(), signum)
        self.received.clear()
