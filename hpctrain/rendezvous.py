"""Rendezvous for Slurm jobs without a fixed port.

Rank 0 opens a TCPStore on a port the kernel picks (port 0), so two jobs sharing a node can
never collide, and writes the port into the run dir, which every rank already shares (it reads
config.yaml from there). The others read it and connect to MASTER_ADDR, the first host of the
node list; where a site's Slurm node names do not resolve (NodeName differs from the host
name), they use the host name rank 0 published beside the port. The file's name carries the
job id, restart count and step id, so a requeued job or a relaunched step never reads a port
from an earlier life.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from pathlib import Path

import torch.distributed as dist


def port_file(directory: Path, job_id: str, restart: int, step_id: str) -> Path:
    return directory / f"{job_id}.r{restart}.s{step_id}.port"


def open_store(
    rank: int, world_size: int, master_addr: str, path: Path, timeout_s: float
) -> dist.TCPStore:
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"port": store.port, "host": socket.gethostname()}))
        tmp.replace(path)  # readers see nothing or the whole record, never half of one
        return store
    published = _wait_for_record(path, timeout_s)
    host = master_addr if resolves(master_addr) else published["host"]
    return dist.TCPStore(host, int(published["port"]), world_size, is_master=False, timeout=timeout)


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def _wait_for_record(path: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise TimeoutError(f"rank 0 did not publish its rendezvous port in {path} within {timeout_s:.0f} s")
