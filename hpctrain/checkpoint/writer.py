"""One background thread writes checkpoints; never two writes at once."""

from __future__ import annotations

import collections
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
from hpctrain.run.events import Checkpoint

log = logging.getLogger(__name__)


class DiskFull(UserError, OSError):
    """A checkpoint did not fit on the disk (or in the quota); the ones before it are intact.
    Still an OSError to code that handles those; told without a traceback like a UserError."""


class BackgroundWriter:
    def __init__(
        self, folder: Path, keep: int, on_written: Callable[[Checkpoint], None], meta: dict[str, Any] | None = None
    ) -> None:
        self.folder = folder
        self.keep = keep
        self.on_written = on_written  # called in the writer thread with the checkpoint's record
        self.meta = dict(meta or {})  # more fields for every checkpoint's .json (not the record)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._control = store.WriteControl()  # of the write under way
        self.inflight_step: int | None = None
        self._inflight_bytes = 0  # what the write under way will write, about
        self._inflight_started = 0.0
        # A forced save's estimate of a full write (bytes/s): the fastest of the last few complete
        # writes. Background writes run at the lowest priority beside training; a forced write
        # runs alone, so the fastest pace is the fitting one (and a write that overruns its
        # deadline anyway is cancelled: hpctrain.checkpoint.forced).
        self.bytes_per_s: float | None = None
        self._recent_rates: collections.deque[float] = collections.deque(maxlen=5)

    def pending(self) -> bool:
        """A write was started and not yet waited for (it may have ended)."""
        return self._thread is not None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def estimate_s(self, nbytes: int) -> float | None:
        """Seconds a write of `nbytes` takes, from the last complete write (or the one under way)."""
        rate = self.bytes_per_s or self._inflight_rate()
        return None if not rate else nbytes / rate

    def inflight_left_s(self) -> float | None:
        """Seconds the write under way still needs, at its own pace so far (None: no write)."""
        if not self.busy():
            return None
        rate = self._inflight_rate() or self.bytes_per_s
        left = max(0, self._inflight_bytes - self._control.bytes_done)
        return None if not rate else left / rate

    def _inflight_rate(self) -> float | None:
        elapsed = time.perf_counter() - self._inflight_started
        done = self._control.bytes_done
        # Too early to tell (the first chunks land in the page cache): no estimate.
        return done / elapsed if self.busy() and done >= store.CHUNK_BYTES and elapsed > 0 else None

    def abandon(self) -> bool:
        """Cancel the write under way and wait until it has removed its files. True when it was
        cancelled, False when there was none or it completed first (then it counts)."""
        if self._thread is None:
            return False
        self._control.cancel.set()
        self._thread.join()
        self._thread = None
        cancelled = isinstance(self._error, store.WriteAbandoned)
        if cancelled:
            self._error = None
        return cancelled

    def wait(self) -> None:
        """Block until the write under way (if any) is on disk; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def cancel_current(self) -> None:
        """Ask the write under way (background or not) to stop; it removes its files."""
        self._control.cancel.set()

    def wait_unless(self, give_up: Callable[[], bool], poll_s: float = 0.1) -> bool:
        """wait(), unless `give_up()` turns true first: then False, the write still under way."""
        while self.busy():
            if give_up():
                return False
            assert self._thread is not None
            self._thread.join(poll_s)
        self.wait()
        return True

    def start(
        self,
        step: int,
        state: dict[str, Any],
        info: dict[str, Any],
        background: bool,
        nbytes: int = 0,
        in_flight: Callable[[], None] | None = None,
    ) -> None:
        """Write `state` (already a snapshot the trainer no longer touches; about `nbytes`).
        `info` goes into the checkpoint's .json and its `checkpoint` record: `reason` (a
        CheckpointReason), `blocking_s`, and for a forced save `deadline_s` and `forced_save`.
        `in_flight` runs once, right after the first bytes are written (a fault point)."""
        self.wait()
        self._control = store.WriteControl(in_flight)
        self.inflight_step, self._inflight_bytes, self._inflight_started = step, nbytes, time.perf_counter()
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
            entry = store.write(self.folder, step, state, {**info, **self.meta}, self._control)
            store.prune(self.folder, self.keep)
        except store.WriteAbandoned as abandoned:  # asked for by abandon(): not an error
            log.warning("checkpoint at step %d abandoned (%s); the previous checkpoints are intact", step, abandoned)
            self._error = abandoned
            return
        except BaseException as error:  # reported to the trainer at the next wait()
            log.error("checkpoint at step %d failed: %s; the previous checkpoints are intact", step, error)
            self._error = self._disk_full(step, error) or error
            return
        write_s = time.perf_counter() - started
        size = entry.data.stat().st_size if entry.data.exists() else 0
        if write_s > 0 and size:
            self._recent_rates.append(size / write_s)
            self.bytes_per_s = max(self._recent_rates)
        self.on_written(Checkpoint(**info, step=step, write_s=round(write_s, 4)))

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
