"""The straggler watch's clock on CPU (hpctrain.trainer.straggler_watch.OwnWorkTimer): the time a
rank waited for a core is left out, the time it worked or was blocked is not. Real threads on a
real core shared with a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from hpctrain.trainer.straggler_watch import SCHEDSTAT, OwnWorkTimer

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
def a_core_shared_with_a_busy_process(pin_self: bool = True) -> Iterator[None]:
    """This thread (and the threads it starts) on one core that a spinning process also wants."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        if pin_self:
            os.sched_setaffinity(0, {core})
        time.sleep(0.3)  # the burner spinning on the core
        yield
    finally:
        os.sched_setaffinity(0, before)
        burner.kill()
        burner.wait()


# Run in a process of its own: torch's intra-op workers are made at its first parallel work and
# keep the core set their maker had then.
WORKERS_KEPT_WAITING = """
import os, threading, time, torch
from hpctrain.trainer.workers_wait import WorkersWait
os.sched_setaffinity(0, {CORE})
torch.set_num_threads(2)
waits = WorkersWait()  # made by the training thread: its own wait is in its steps' times
a = torch.randn(384, 384)
until = time.perf_counter() + 0.6
while time.perf_counter() < until:
    a @ a  # two workers' work on the one core the burner also wants
workers = waits.since_last_s()
def spin():
    until = time.thread_time() + 0.3
    while time.thread_time() < until:
        pass
python_thread = threading.Thread(target=spin)  # hpctrain's own threads are not workers
python_thread.start()
python_thread.join()
spin()  # nor is the training thread
print(workers, waits.since_last_s())
"""


def test_the_intra_op_workers_wait_for_a_core_is_read_and_no_other_threads() -> None:
    core = min(os.sched_getaffinity(0))
    with a_core_shared_with_a_busy_process(pin_self=False):  # the script pins itself, imports done
        script = WORKERS_KEPT_WAITING.replace("{CORE}", f"{{{core}}}")
        # Idle workers sleep (as torch's do once OMP's spin ends): spinning, they would wait for the core too.
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    workers, others = map(float, done.stdout.split())
    assert workers > 0.1, workers  # the worker had the core a third of the time at most
    assert others < 0.02, others


# A data loader worker (a child process) on the one core the burner also wants; the training
# thread sleeps waiting for its batches (no wait for a core of its own).
LOADER_KEPT_WAITING = """
import os, time, torch
from torch.utils.data import DataLoader, Dataset
from hpctrain.trainer.workers_wait import WorkersWait
os.sched_setaffinity(0, {CORE})
torch.set_num_threads(1)
class Work(Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, index):
        until = time.thread_time() + 0.02  # 20 ms of CPU an item: the worker always wants the core
        while time.thread_time() < until:
            pass
        return index
loader = iter(DataLoader(Work(), batch_size=1, num_workers=1, persistent_workers=True))
next(loader)  # the worker started
waits = WorkersWait()
until = time.perf_counter() + 0.8
while time.perf_counter() < until:
    next(loader)
print(waits.since_last_s())
"""


def test_the_data_loader_workers_wait_for_a_core_is_read() -> None:
    core = min(os.sched_getaffinity(0))
    with a_core_shared_with_a_busy_process(pin_self=False):  # the script pins itself, imports done
        script = LOADER_KEPT_WAITING.replace("{CORE}", f"{{{core}}}")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    waited = float(done.stdout.split()[-1])
    assert waited > 0.2, waited  # of 0.8 s the worker had the core about half


def test_a_step_begun_or_ended_while_the_rank_writes_its_checkpoint_is_not_timed() -> None:
    writing = [False]
    timer = OwnWorkTimer(torch.device("cpu"), untimed=lambda: writing[0])
    for begins, ends in ((False, False), (True, False), (False, True), (True, True), (False, False)):
        writing[0] = begins
        timer.begin()
        writing[0] = ends
        timer.end()
    assert len(timer.take()) == 2  # the first and the last


def test_the_waits_inside_a_step_are_left_out_and_waits_outside_any_step_ignored() -> None:
    """A sharded model's gathers (hpctrain.trainer.sharding.time_gathers) inside a timed step."""
    timer = OwnWorkTimer(torch.device("cpu"))
    timer.wait_begins()  # outside a step (an evaluation's forward): nothing
    timer.wait_ends()
    timer.begin()
    time.sleep(0.05)  # its own work
    timer.wait_begins()
    time.sleep(0.2)  # waiting in a gather for a slow peer
    timer.wait_ends()
    timer.end()
    (timed,) = timer.take()
    assert 0.045 <= timed < 0.15, timed


# Two real ranks on gloo: rank 1 comes to each forward 0.3 s late, so rank 0 waits in DDP's
# broadcast of its BatchNorm buffers. Rank 0 times a forward with the broadcast bracketed
# (hpctrain.trainer.components.time_buffer_sync) and one without: only the second holds the wait.
LATE_PEER = """
import os, sys, time, torch, torch.distributed as dist
from torch import nn
from hpctrain.trainer.components import time_buffer_sync
from hpctrain.trainer.straggler_watch import OwnWorkTimer
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2)
def model():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 2))
bracketed, plain = nn.parallel.DistributedDataParallel(model()), nn.parallel.DistributedDataParallel(model())
timer = OwnWorkTimer(torch.device("cpu"))
time_buffer_sync(bracketed, timer)
times = []
for ddp in (bracketed, plain):
    dist.barrier()
    if rank == 1:
        time.sleep(0.3)
    timer.begin()
    loss = ddp(torch.randn(8, 1, 8, 8)).sum()
    timer.end()
    loss.backward()
    times += timer.take()
print(*times)
"""


def test_a_forward_waiting_in_ddps_broadcast_of_buffers_is_not_own_work(tmp_path: Path) -> None:
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    script = tmp_path / "late_peer.py"
    script.write_text(LATE_PEER)
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(r), port], stdout=subprocess.PIPE, text=True) for r in (0, 1)
    ]
    outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    bracketed, plain = map(float, outputs[0].split())
    assert plain > 0.25, plain  # the clock sees the wait: the bracket has something to take out
    assert bracketed < 0.15, bracketed
