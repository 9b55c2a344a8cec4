"""The straggler watch's clock on CPU (hpctrain.trainer.straggler_watch.OwnWorkTimer): the time a
rank waited for a core is left out, the time it worked or was blocked is not. Real threads on a
real core shared with a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hpctrain.trainer.straggler_watch import SCHEDSTAT, OtherThreadsWait, OwnWorkTimer

pytestmark = pytest.mark.skipif(not Path(SCHEDSTAT).exists(), reason="the kernel shows no scheduler statistics")


def busy(seconds_of_cpu: float) -> None:
    until = time.thread_time() + seconds_of_cpu
    while time.thread_time() < until:
        pass


def test_a_rank_sharing_its_core_with_another_process_is_timed_at_its_own_work() -> None:
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.3)  # the burner spinning on the core
        timer = OwnWorkTimer(torch.device("cpu"))
        began = time.perf_counter()
        timer.begin()
        busy(0.4)
        timer.end()
        wall = time.perf_counter() - began
    finally:
        os.sched_setaffinity(0, before)
        burner.kill()
        burner.wait()
    (timed,) = timer.take()
    assert wall > 0.6, f"the core was not shared ({wall:.2f} s of wall for 0.4 s of work)"
    assert 0.35 < timed < 0.55, (timed, wall)  # its 0.4 s of work, not the wall's


def test_time_blocked_or_sleeping_still_counts() -> None:
    timer = OwnWorkTimer(torch.device("cpu"))
    timer.begin()
    time.sleep(0.2)  # a forward waiting on I/O, or a rank stopped: not waiting for a core
    timer.end()
    (timed,) = timer.take()
    assert timed >= 0.19, timed


def test_without_scheduler_statistics_the_wall_clock_alone(tmp_path: Path) -> None:
    timer = OwnWorkTimer(torch.device("cpu"))
    timer._schedstat = str(tmp_path / "none")  # a kernel without them
    timer.begin()
    time.sleep(0.05)
    timer.end()
    (timed,) = timer.take()
    assert timed >= 0.045 and timer._schedstat is None


@contextmanager
def a_core_shared_with_a_busy_process() -> Iterator[None]:
    """This thread (and the threads it starts) on one core that a spinning process also wants."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.3)  # the burner spinning on the core
        yield
    finally:
        os.sched_setaffinity(0, before)
        burner.kill()
        burner.wait()


def test_the_other_threads_wait_for_a_core_is_read_and_the_training_threads_is_not() -> None:
    waits = OtherThreadsWait()  # made by the training thread: its own wait is in its steps' times
    with a_core_shared_with_a_busy_process():
        # An intra-op worker (pinned as its maker): it lives on between steps, as torch's do.
        worked, done = threading.Event(), threading.Event()
        worker = threading.Thread(target=lambda: (busy(0.3), worked.set(), done.wait()))
        worker.start()
        worked.wait()
        workers_wait = waits.since_last_s()
        busy(0.3)  # the training thread's own work on the shared core
        own_wait = waits.since_last_s()
        done.set()
        worker.join()
    assert workers_wait > 0.15, workers_wait  # about 0.3 s: the burner had the core half the time
    assert own_wait < 0.05, own_wait


def test_a_step_begun_or_ended_while_the_rank_writes_its_checkpoint_is_not_timed() -> None:
    writing = [False]
    timer = OwnWorkTimer(torch.device("cpu"), untimed=lambda: writing[0])
    for begins, ends in ((False, False), (True, False), (False, True), (True, True), (False, False)):
        writing[0] = begins
        timer.begin()
        writing[0] = ends
        timer.end()
    assert len(timer.take()) == 2  # the first and the last
