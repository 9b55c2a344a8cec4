"""How long a training process's compute workers (torch's intra-op threads) waited for a core:
read by the straggler watch once a window (hpctrain.trainer.straggler_watch), so that a rank
whose workers a busy machine left waiting is not taken for a slow node."""

from __future__ import annotations

import os
import threading
from pathlib import Path

TASKS = "/proc/self/task"  # a folder per thread of the process, each with its schedstat


class WorkersWait:
    """Seconds the process's compute workers (torch's intra-op threads: OpenMP's, MKL's) waited for
    a core since the last call: the kernel's run-queue delay of each (/proc/self/task/*/schedstat),
    read once a window. Workers are the native threads that carry the process's own name: torch
    names its others (pt_gloo_runloop, gloo_tcp_loop, pt_tcpstore_uv), and Python's own threads
    (hpctrain's watchdog, heartbeats, checkpoint writer) are known to `threading`. The others are
    left out because they all wait for a core at once when a stopped rank is let go again: counted,
    they made a rank stopped 1.5x slow look no slower than its peers. The training thread's own
    wait is already out of its steps' times."""

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
            if not self.workers[tid]:
                continue
            try:
                now[tid] = int(Path(TASKS, tid, "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended as it was read
                continue
        # A worker first seen now started in this window: all its wait is the window's.
        waited = sum(ns - self.seen.get(tid, 0) for tid, ns in now.items())
        self.seen = now
        return max(0, waited) / 1e9


def _comm(tid: str) -> str | None:
    try:
        return Path(TASKS, tid, "comm").read_text().strip()
    except OSError:
        return None
