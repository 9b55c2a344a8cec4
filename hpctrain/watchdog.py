"""End a training process that stopped making progress, so recovery can take over.

A hung collective or a stuck filesystem would otherwise burn the allocation until the time
limit. The trainer calls `beat()` after every step (and around evaluation and saving); if no
beat comes for `timeout_s`, every thread's stack is dumped to stderr (the Slurm .out file) and
the process exits with EXIT_HANG, which the batch script counts against the `hang` budget.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time

from hpctrain.exitcodes import EXIT_HANG

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpctrain-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                log.error("no training step finished for %.0f s (trainer.hang_timeout_s=%s): ending this "
                          "process so the job can recover; stacks follow", idle, self.timeout_s)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(EXIT_HANG)  # no cleanup: the threads that would run it are the stuck ones
