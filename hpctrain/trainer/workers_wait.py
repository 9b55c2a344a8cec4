"""How long a training process's workers (torch's intra-op threads, its data loader's worker
processes) waited for a core: read by the straggler watch once a window
(hpctrain.trainer.straggler_watch), so that a rank whose workers a busy machine left waiting is not
taken for a slow node."""

from __future__ import annotations

import os
import threading
from pathlib import Path

TASKS = "/proc/self/task"  # a folder per thread of the process, each with its schedstat
PROC = "/proc"


class WorkersWait:
    """Seconds the process's workers waited for a core since the last call: the kernel's run-queue
    delay of each (schedstat), read once a window. Two kinds of worker:
    - torch's intra-op threads (OpenMP's, MKL's): the native threads that carry the process's own
      name. torch names its others (pt_gloo_runloop, gloo_tcp_loop, pt_tcpstore_uv), and Python's
      own threads (hpctrain's watchdog, heartbeats, checkpoint writer) are known to `threading`.
      The others are left out because they all wait for a core at once when a stopped rank is let
      go again: counted, they made a rank stopped 1.5x slow look no slower than its peers.
    - the process's child processes, every thread of each: the data loader's workers
      (data.num_workers). A worker left waiting for a core falls behind and the training thread
      then waits for its batch, which is in the step's own time (in a loaded run of the suite a
      rank whose two loader workers shared two cores with other tests was named 1.87x slow).
      A stopped rank's loader workers fill their queue and then sleep: they do not wait for a core.
    The training thread's own wait is already out of its steps' times."""

    def __init__(self) -> None:
        self.own_name = _comm(str(threading.get_native_id()))
        self.workers: dict[str, bool] = {}  # thread id -> a compute worker (decided when first seen)
        self.seen: dict[str, int] = {}  # worker's thread id -> its run-queue ns at the last reading
        self.shown = Path(TASKS).is_dir() and self.own_name is not None
        self.since_last_s()

    def since_last_s(self) -> float:
        if not self.shown:
            return 0.0
        try:
            tids = os.listdir(TASKS)
        except OSError:
            return 0.0
        python_threads = {str(t.native_id) for t in threading.enumerate()}
        now: dict[str, int] = {}
        for tid in tids:
            if tid not in self.workers:
                self.workers[tid] = tid not in python_threads and _comm(tid) == self.own_name
            if self.workers[tid]:
                _read_wait(now, tid, Path(TASKS, tid, "schedstat"))
        for child in _children(tids):
            for tid in _threads(child):
                _read_wait(now, f"{child}/{tid}", Path(PROC, child, "task", tid, "schedstat"))
        # A worker first seen now started in this window: all its wait is the window's.
        waited = sum(ns - self.seen.get(tid, 0) for tid, ns in now.items())
        self.seen = now
        return max(0, waited) / 1e9


def _read_wait(into: dict[str, int], key: str, schedstat: Path) -> None:
    try:
        into[key] = int(schedstat.read_text().split()[1])
    except (OSError, IndexError, ValueError):  # the thread ended as it was read
        pass


def _children(tids: list[str]) -> set[str]:
    """The process ids of this process's children (each thread's, as the kernel lists them;
    none where the kernel does not: CONFIG_PROC_CHILDREN)."""
    found: set[str] = set()
    for tid in tids:
        try:
            found.update(Path(TASKS, tid, "children").read_text().split())
        except OSError:
            continue
    return found


def _threads(pid: str) -> list[str]:
    try:
        return os.listdir(Path(PROC, pid, "task"))
    except OSError:  # the child ended
        return []


def _comm(tid: str) -> str | None:
    try:
        return Path(TASKS, tid, "comm").read_text().strip()
    except OSError:
        return None
