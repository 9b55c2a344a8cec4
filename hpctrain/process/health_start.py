"""A life's health at its start, in the training process: this node's checks before the
rendezvous (hpctrain.process.node_health, by the node's first task), and one timed all-reduce
among all ranks after it. What they measured goes in the life's `start` (`health`)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.config.schema import Config
from hpctrain.dist.context import DistContext
from hpctrain.process import node_health
from hpctrain.run.events import Journal
from hpctrain.run.paths import RunDir


def node_checks(config: Config, run_dir: Path, ctx: DistContext) -> dict[str, float]:
    """slurm.health's checks of this node, by its first task, in a Slurm job (elsewhere there is
    no other node to go on with): each check's seconds; NodeUnhealthy when one fails."""
    checks = config.slurm.health
    if ctx.life.job_id is None or ctx.local_rank != 0 or not (checks.checks or checks.command):
        return {}
    node = ctx.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    began = time.monotonic()
    seconds = node_health.gate(
        checks,
        run_dir,
        node,
        config.slurm.gpus_per_node,
        torch.cuda.device_count,
        Journal(RunDir(run_dir).events),
        ctx.life,
    )
    return {**seconds, "checks_s": round(time.monotonic() - began, 4)}


def timed_allreduce(ctx: DistContext) -> dict[str, float]:
    """One all-reduce of node_health.ALLREDUCE_BYTES among all ranks, after one to warm the link:
    its seconds and bus bandwidth, the same on every rank (the slowest rank's time)."""
    data = torch.zeros(node_health.ALLREDUCE_BYTES // 4, dtype=torch.float32, device=ctx.device)
    dist.all_reduce(data)
    _synchronize(ctx)
    began = time.perf_counter()
    dist.all_reduce(data)
    _synchronize(ctx)
    took = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    seconds = float(took.item())
    return {
        "allreduce_s": round(seconds, 5),
        "allreduce_gbps": round(node_health.allreduce_gbps(ctx.world_size, seconds), 3),
    }


def _synchronize(ctx: DistContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
