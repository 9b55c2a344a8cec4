"""Build the objects a run trains with, from the config's `_target_` nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config import Config, targets
from hpctrain.data.splits import Splits
from hpctrain.dist import DistContext


@dataclass
class Components:
    raw_model: nn.Module  # the user's module: what model.pt and checkpoints hold
    model: nn.Module  # what the step calls: DDP-wrapped and maybe compiled
    optimizer: torch.optim.Optimizer
    scheduler: Any  # an LR scheduler, or None
    loss_fn: nn.Module
    splits: Splits


def rank_seed(seed: int, rank: int) -> int:
    """A different stream per rank for dropout and augmentation, the same on every rerun."""
    return seed + 10_007 * (rank + 1)


def build(config: Config, ctx: DistContext, total_steps_for: Any) -> Components:
    """`total_steps_for(splits)` gives the run's optimizer steps once the data is known."""
    splits = targets.build(config.data.dataset)
    if not isinstance(splits, Splits):
        raise ValueError(f"data.dataset._target_ must return hpctrain.data.splits.Splits (got {type(splits).__name__})")
    # The same seed on every rank gives the same initial weights (DDP also broadcasts rank 0's).
    torch.manual_seed(config.trainer.seed)
    raw_model = targets.build(config.model).to(ctx.device)
    torch.manual_seed(rank_seed(config.trainer.seed, ctx.rank))
    model = wrap(raw_model, config, ctx)
    optimizer = targets.build(config.optim, raw_model.parameters())
    scheduler = None
    if config.sched is not None:
        extra = {"total_steps": total_steps_for(splits)} if targets.accepts(config.sched, "total_steps") else {}
        scheduler = targets.build(config.sched, optimizer, **extra)
    loss_fn = targets.build(config.loss)
    return Components(raw_model, model, optimizer, scheduler, loss_fn, splits)


def wrap(raw_model: nn.Module, config: Config, ctx: DistContext) -> nn.Module:
    model: nn.Module = raw_model
    if ctx.distributed:
        model = DistributedDataParallel(
            raw_model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=config.trainer.bucket_cap_mb,
            gradient_as_bucket_view=config.trainer.gradient_as_bucket_view,
        )
    if config.trainer.compile:
        # Compiling the DDP wrapper lets Dynamo split graphs at bucket boundaries (DDPOptimizer).
        model = torch.compile(model)  # type: ignore[assignment]
    return model
