"""The `start` record of a life: where every rank runs, what it resumed from, how long it took."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

from hpctrain.dist.context import DistContext
from hpctrain.run.events import Start
from hpctrain.trainer.layout import Layout


def start_record(
    ctx: DistContext,
    resumed_from_step: int,
    total_steps: int,
    layout: Layout,
    startup: dict[str, float],
    health: dict[str, float] | None = None,
    resumed_from: str | None = None,
) -> Start:
    """Collective: every rank reports where it runs, which GPU it binds and which CPUs it may run
    on (Slurm's task/affinity pins each task to its slurm.cpus_per_task CPUs), so the journal
    shows the layout. `startup`: the start-up's phases (hpctrain.process.startup_clock)."""
    mine = {
        "node": ctx.node or socket.gethostname(),
        "gpu": ctx.gpu,
        "device": str(ctx.device),
        # None where the OS cannot say (macOS has no sched_getaffinity).
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    ranks: list[Any] = [mine]
    if ctx.distributed:
        ranks = [None] * ctx.world_size
        dist.all_gather_object(ranks, mine)
    return Start(
        job_id=ctx.life.job_id,
        restart=ctx.life.restart,
        world_size=ctx.world_size,
        nodes=sorted({r["node"] for r in ranks}),
        resumed_from_step=resumed_from_step,
        resumed_from=resumed_from,
        total_steps=total_steps,
        ranks=ranks,
        allocated_at=ctx.life.allocated_at,
        startup=startup or None,
        layout=layout.as_dict(),
        # What the allocation holds, for what a run costs (hpctrain-status): Slurm's own counts,
        # as this life's step sees them.
        job_nodes=ctx.life.job_nodes,
        gpus_per_node=ctx.life.gpus_on_node,
        health=health or None,
    )
