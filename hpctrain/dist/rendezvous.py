"""Rendezvous for Slurm jobs without a fixed port.

Rank 0 opens a TCPStore on a port the kernel picks (port 0), so two jobs sharing a node can
never collide, and writes the port into the run dir, which every rank already shares (it reads
config.yaml from there), beside the address the others should connect to. Rank 0 decides that
address itself, so it is right wherever Slurm put task 0 (a heterogeneous job's step may start
on any node): its IPv4 address on `slurm.network.master_addr_ifname`, else its Slurm node name
plus `slurm.network.master_addr_suffix`, else its node name where that resolves (NodeName may
differ from the host name) or its host name. The file's name carries the job id, restart count
and step id, so a requeued job or a relaunched step never reads a port from an earlier life.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path

import torch.distributed as dist

from hpctrain.run import rendezvous_record
from hpctrain.run.node_address import interface_ipv4, rank0_address, resolves

__all__ = ["interface_ipv4", "open_store", "port_file", "rank0_address", "resolves"]


def port_file(directory: Path, job_id: str, restart: int, step_id: str) -> Path:
    return directory / f"{job_id}.r{restart}.s{step_id}.port"


def open_store(rank: int, world_size: int, path: Path, timeout_s: float, address: str = "") -> dist.TCPStore:
    """Rank 0 (with the `address` the others should use, see rank0_address) listens and
    publishes; the others wait for the record and connect."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        rendezvous_record.publish(
            path, {"port": store.port, "host": socket.gethostname(), "addr": address or socket.gethostname()}
        )
        return store
    published = rendezvous_record.wait_for(path, timeout_s)
    if published is None:
        raise TimeoutError(f"rank 0 did not publish its rendezvous port in {path} within {timeout_s:.0f} s")
    return dist.TCPStore(published["addr"], int(published["port"]), world_size, is_master=False, timeout=timeout)
