"""Calls run in order on a thread of their own, so a slow or dead remote service never stalls a
training step. The first failure is told once; every call after it is dropped."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


class BackgroundCalls:
    def __init__(self, label: str) -> None:
        self.label = label  # names the service in the one warning: "MLflow"
        self.failed = False
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # A daemon: a process ending (a stop signal, an error) never waits on a hung connection.
        self._thread = threading.Thread(target=self._serve, name=f"hpctrain-{label.lower()}", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        if not self.failed:
            self._queue.put((call, args))

    def close(self, timeout_s: float) -> None:
        """Let the queued calls finish, waiting at most `timeout_s`."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive() and not self.failed:
            log.warning("%s: gave up waiting after %.0fs; its last metrics may be missing", self.label, timeout_s)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            if self.failed:
                continue
            call, args = item
            try:
                call(*args)
            except Exception as error:
                self.failed = True
                warn_failed(self.label, error)


def warn_failed(label: str, error: Exception) -> None:
    """The one line told when a sink fails (its first line only: some errors run to pages)."""
    reason = (str(error).strip().splitlines() or [""])[0]
    log.warning(
        "%s failed (%s: %s); training goes on without it (metrics.jsonl has every step)",
        label,
        type(error).__name__,
        reason,
    )
