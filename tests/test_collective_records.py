"""The last collectives in a rank's hang report, from torch's own Flight Recorder in a real gloo
process group (hpctrain.dist.collective_records): two ranks, one of which entered a collective
the other never reached; each writes its hang report, and the one behind is named."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.dist import collective_records
from hpctrain.run import hang_reports
from hpctrain.run.life import LifeStamp


def test_a_users_own_ring_size_stands() -> None:
    env: dict[str, str] = {}
    collective_records.enable(64, env)  # this machine's torch: the Flight Recorder of every backend
    assert env == {"TORCH_FR_BUFFER_SIZE": "64"}
    older: dict[str, str] = {}
    collective_records.enable(64, older, current=False)
    assert older == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    collective_records.enable(64, mine)
    assert mine == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    off: dict[str, str] = {}
    collective_records.enable(0, off)
    assert off == {}


# One rank, in a process of its own (as srun starts them): three all-reduces, then rank 0 enters
# a fourth that rank 1 reaches only once both have written their hang reports.
RANK = """
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from hpctrain.dist import collective_records
from hpctrain.process.watchdog import HangReport
from hpctrain.run.life import LifeStamp
rank, port, run_root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
collective_records.enable(64)
dist.init_process_group("gloo", rank=rank, world_size=2)
data = torch.ones(1000)
for _ in range(3):
    dist.all_reduce(data)
waiting = dist.all_reduce(data, async_op=True) if rank == 0 else None
report = HangReport(Path(run_root), LifeStamp("41", 0), rank, 2, f"node{rank + 1}")
report.write(61.0, 3, "a training step")
if rank == 1:  # rank 0's report written too (no collective: rank 0 waits in one), then join it
    while not (report.folder / "rank-0.txt").exists():
        time.sleep(0.05)
    dist.all_reduce(data)
if waiting is not None:
    waiting.wait()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_the_rank_behind_its_peers_collectives_is_named(tmp_path: Path) -> None:
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port, str(tmp_path)], stderr=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    for proc in ranks:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    folder = hang_reports.folder_of(tmp_path, LifeStamp("41", 0))
    ahead, behind = (hang_reports.report_path(folder, rank).read_text() for rank in (0, 1))
    assert "last collectives (torch's Flight Recorder), newest last:" in ahead
    assert "gloo:all_reduce" in ahead and "sizes [[1000]]" in ahead, ahead
    newest = {
        rank: int(line.split()[-1])
        for rank, text in enumerate((ahead, behind))
        for line in text.splitlines()
        if line.startswith(hang_reports.NEWEST_WORDS)
    }
    assert newest[0] == newest[1] + 1, newest
    assert hang_reports.behind(folder) == [1]
    # Then every thread's stack, as before.
    assert "Thread 0x" in ahead or "Current thread" in ahead
