"""Build the objects a run trains with, from the config's `_target_` nodes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config import Config, TrainerConfig, targets
from hpctrain.data.splits import Splits
from hpctrain.dist.context import DistContext
from hpctrain.trainer import sharding
from hpctrain.trainer.model_io import PLAIN, Contract
from hpctrain.trainer.straggler_watch import OwnWorkTimer


@dataclass
class Components:
    raw_model: nn.Module  # the user's module: what model.pt and checkpoints hold
    model: nn.Module  # what the step calls: DDP-wrapped and maybe compiled, or FSDP-sharded
    ddp: DistributedDataParallel | None  # the DDP wrapper inside `model` (no_sync), if distributed
    optimizer: torch.optim.Optimizer
    scheduler: Any  # an LR scheduler, or None
    loss_fn: nn.Module
    splits: Splits
    # trainer.strategy=fsdp: no process holds the whole model (one process alone holds a plain one),
    # so evaluation and model.pt take every rank (see hpctrain.trainer.weights).
    sharded: bool
    # How the model is called and its output read (hpctrain.trainer.model_io).
    contract: Contract = PLAIN


def rank_seed(seed: int, rank: int) -> int:
    """A different stream per rank for dropout and augmentation, the same on every rerun."""
    return seed + 10_007 * (rank + 1)


def build(config: Config, ctx: DistContext, total_steps_for: Callable[[Splits], int]) -> Components:
    """`total_steps_for(splits)` gives the run's optimizer steps once the data is known."""
    splits = targets.build(config.data.dataset)
    if not isinstance(splits, Splits):
        raise ValueError(f"data.dataset._target_ must return hpctrain.data.splits.Splits (got {type(splits).__name__})")
    # The same seed on every rank gives the same initial weights (DDP also broadcasts rank 0's).
    torch.manual_seed(config.trainer.seed)
    raw_model = targets.build(config.model).to(ctx.device)
    torch.manual_seed(rank_seed(config.trainer.seed, ctx.rank))
    if config.trainer.strategy == "fsdp" and ctx.distributed:
        # Sharded in place: every rank built the same weights above (FSDP broadcasts nothing).
        model, ddp = sharding.shard(raw_model, config.trainer, ctx), None
    else:
        model, ddp = wrap(raw_model, config.trainer, ctx)
    # A factory whose first parameter is `named_parameters` gets the names too (param_groups).
    by_name = targets.first_parameter(config.optim, "optim") == "named_parameters"
    optimizer = targets.build(config.optim, list(raw_model.named_parameters()) if by_name else raw_model.parameters())
    scheduler = build_scheduler(config, optimizer, total_steps_for(splits))
    loss_fn = targets.build(config.loss)
    sharded = config.trainer.strategy == "fsdp"
    contract = Contract.of(raw_model, config.trainer.model_takes_targets, splits.next_token)
    return Components(raw_model, model, ddp, optimizer, scheduler, loss_fn, splits, sharded, contract)


def build_scheduler(config: Config, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    """The LR scheduler of `config.sched` (None without one), told the run's steps if it asks."""
    if config.sched is None:
        return None
    extra = {"total_steps": total_steps} if targets.accepts(config.sched, "total_steps") else {}
    return targets.build(config.sched, optimizer, **extra)


def wrap(
    raw_model: nn.Module, trainer: TrainerConfig, ctx: DistContext
) -> tuple[nn.Module, DistributedDataParallel | None]:
    """(what the step calls, the DDP wrapper inside it or None on one process)."""
    model: nn.Module = raw_model
    ddp = None
    if ctx.distributed:
        model = ddp = DistributedDataParallel(
            raw_model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            bucket_cap_mb=trainer.bucket_cap_mb,
            gradient_as_bucket_view=trainer.gradient_as_bucket_view,
        )
    if trainer.compile:
        # Compiling the DDP wrapper lets Dynamo split graphs at bucket boundaries (DDPOptimizer),
        # so all-reduces overlap the backward. The result is no DDP instance, which is why the
        # wrapper is returned too: no_sync must be entered on it (see grad_sync).
        model = torch.compile(model)  # type: ignore[assignment]
    return model, ddp


def grad_sync(ddp: DistributedDataParallel | None, last: bool) -> AbstractContextManager[Any]:
    """The context of a micro-batch's forward and backward: gradients all-reduce on the last
    micro-batch of a step only; before it, DDP's no_sync keeps them local (no communication).
    Dynamo runs DDP's forward hooks eagerly, so no_sync holds for a compiled DDP model too."""
    if last or ddp is None:
        return contextlib.nullcontext()
    return ddp.no_sync()


def time_buffer_sync(ddp: DistributedDataParallel, timer: OwnWorkTimer) -> None:
    """DDP's broadcast of rank 0's buffers before each forward (a model with BatchNorm) timed as a
    wait (hpctrain.trainer.straggler_watch.OwnWorkTimer): each rank waits there for the others, so
    whichever arrives first looks slow (a timm ResNet's rank 0 read 2x its peer under load). DDP
    does it in its own forward before it calls the module: a hook before DDP's forward and one
    before the module's bracket it."""
    if not (ddp.broadcast_buffers and any(True for _ in ddp.module.buffers())):
        return
    ddp.register_forward_pre_hook(torch.compiler.disable(lambda *_: timer.wait_begins()))
    ddp.module.register_forward_pre_hook(torch.compiler.disable(lambda *_: timer.wait_ends()), prepend=True)
