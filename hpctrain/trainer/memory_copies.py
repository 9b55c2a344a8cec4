"""The trainer's use of the in-memory tier (hpctrain.checkpoint.memory_tier): where a life's state
comes from, and the copies it sends while it trains.

On where `trainer.memory_ckpt_every` is set (1 by default) and the batch script started this
life's memory holders (a job with spare nodes: it exports HPCTRAIN_MEMORY_TOKEN and each holder
writes its address to RUN_DIR/memory). With trainer.strategy=fsdp each rank's copy is its own
shards (hpctrain.checkpoint.local_shards). Elsewhere (a local run, a job without spare nodes)
every call here is a no-op and the disk alone is used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hpctrain.checkpoint import local_shards, store
from hpctrain.checkpoint.base import CheckpointMismatch
from hpctrain.checkpoint.memory_client import HolderClient, holder_addresses
from hpctrain.checkpoint.memory_restore import LIST_TIMEOUT_S, restore
from hpctrain.checkpoint.memory_tier import MemoryTier
from hpctrain.checkpoint.restore_point import RestorePoint, partner_nodes
from hpctrain.config import Config, fingerprint
from hpctrain.dist.context import DistContext
from hpctrain.run.events import Start, read_events
from hpctrain.run.memory_wire import TOKEN_ENV
from hpctrain.run.paths import RunDir

log = logging.getLogger(__name__)


def token_for(config: Config, env: Mapping[str, str] = os.environ) -> str | None:
    """The life's token when the tier is on for this run, else None."""
    cfg = config.trainer
    if cfg.memory_ckpt_every <= 0:
        return None
    return env.get(TOKEN_ENV) or None


def newest_whole_on_disk(run: RunDir) -> int | None:
    """The newest checkpoint on disk that looks whole (its size as recorded; the load checks the rest)."""
    steps = [entry.step for entry in store.entries(run.checkpoints) if store.looks_whole(entry)]
    return max(steps, default=None)


def restored(
    config: Config, ctx: DistContext, run: RunDir, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[RestorePoint | None, dict[str, Any] | None]:
    """Collective. The restore point and this rank's state when it comes from memory, its model
    and optimizer loaded in place (None, None: the tier is off, the disk decides as before)."""
    token = token_for(config)
    if token is None:
        return None, None
    holders = {node: HolderClient(a, token, LIST_TIMEOUT_S) for node, a in holder_addresses(run.memory).items()}
    try:
        point, state = restore(ctx, holders, lambda: newest_whole_on_disk(run), lambda: _world_of_last_start(run))
    finally:
        for holder in holders.values():
            holder.close()
    if state is None:
        return point, None
    if state.get("fingerprint") != fingerprint(config):
        # The holders are this life's own (its token): another config's state is a bug, not a user's.
        raise CheckpointMismatch(f"the memory copy of step {point.step} was made by another config; refusing it")
    local_shards.load_model(model, state["model"])
    local_shards.load_optimizer(optimizer, state["optimizer"])
    log.info("resumed from memory at step %d", point.step)
    return point, state


def _world_of_last_start(run: RunDir) -> int | None:
    """The world size of the newest life that started (None: none yet): the life whose copies the
    holders keep (this life writes its own `start` after the restore)."""
    starts = [event for event in read_events(run.events) if isinstance(event, Start)]
    return starts[-1].world_size if starts else None


def tier_for(
    config: Config,
    ctx: DistContext,
    run: RunDir,
    nodes: list[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> MemoryTier | None:
    """The copies this rank sends while it trains (None: the tier is off). `nodes`: every rank's
    node, by rank (the `start` record's): the rank's copies go to its node's holder and to the
    holder of the next training node (restore_point.partner_nodes)."""
    token = token_for(config)
    if token is None:
        return None
    own = nodes[ctx.rank] if ctx.rank < len(nodes) else ctx.node
    partner = partner_nodes(list(dict.fromkeys(nodes))).get(own)
    wanted = [node for node in (own, partner) if node]
    return MemoryTier(
        ctx,
        config.trainer.memory_ckpt_every,
        [],
        model,
        optimizer,
        fingerprint(config),
        find_holders=lambda: {
            node: HolderClient(address, token)
            for node, address in holder_addresses(run.memory).items()
            if node in wanted
        },
        wanted=len(wanted),
        overhead=config.trainer.memory_ckpt_overhead,
    )
