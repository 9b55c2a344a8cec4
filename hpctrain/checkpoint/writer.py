"""One background thread writes checkpoints; never two writes at once."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.checkpoint import store
from hpctrain.errors import UserError

log = logging.getLogger(__name__)


class DiskFull(UserError, OSError):
    """A checkpoint did not fit on the disk (or in the quota); the ones before it are intact.
    Still an OSError to code that handles those; told without a traceback like a UserError."""


class BackgroundWriter:
    def __init__(
        self, folder: Path, keep: int, on_written: Callable[[dict[str, Any]], None], meta: dict[str, Any] | None = None
    ) -> None:
        self.folder = folder
        self.keep = keep
        self.on_written = on_written  # called in the writer thread with the checkpoint's record
        self.meta = dict(meta or {})  # more fields for every checkpoint's .json (not the record)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def wait(self) -> None:
        """Block until the write under way (if any) is on disk; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def start(self, step: int, state: dict[str, Any], info: dict[str, Any], background: bool) -> None:
        """Write `state` (already a snapshot the trainer no longer touches)."""
        self.wait()
        if background:
            self._thread = threading.Thread(target=self._write, args=(step, state, info), daemon=False)
            self._thread.start()
        else:
            self._write(step, state, info)
            self.wait()

    def _write(self, step: int, state: dict[str, Any], info: dict[str, Any]) -> None:
        started = time.perf_counter()
        if threading.current_thread() is not threading.main_thread():
            _yield_cpu_to_training()
        try:
            store.write(self.folder, step, state, {**info, **self.meta})
            store.prune(self.folder, self.keep)
        except BaseException as error:  # reported to the trainer at the next wait()
            log.error("checkpoint at step %d failed: %s; the previous checkpoints are intact", step, error)
            self._error = self._disk_full(step, error) or error
            return
        self.on_written({**info, "step": step, "write_s": round(time.perf_counter() - started, 4)})


    def _disk_full(self, step: int, error: BaseException) -> DiskFull | None:
        if not isinstance(error, OSError) or error.errno not in (errno.ENOSPC, errno.EDQUOT):
            return None
        kept = store.entries(self.folder)
        before = f"the checkpoint of step {kept[0].step} is intact and" if kept else "no earlier checkpoint exists;"
        return DiskFull(
            f"checkpoint at step {step}: {error.strerror} in {self.folder}; {before} nothing of the failed one is "
            f"left. Free space (or raise the quota), then start the run dir again to resume"
        )


def _yield_cpu_to_training() -> None:
    """Lower this (writer) thread's CPU priority. Where the training process has no core to
    spare (a busy or small node), the scheduler then gives the training threads the CPU first
    and the write takes longer instead of the steps. On Linux, nice applies per thread."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: the write still works
        pass
