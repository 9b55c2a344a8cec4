"""Checkpoints: the whole training state saved collectively into the run dir's checkpoints/, and
the newest usable one loaded back. May import: run, slurm, config, dist (never the trainer).

    base          the Checkpointer interface the trainer holds; CheckpointMismatch
    plain         PlainCheckpointer: one .pt written by rank 0 (store: the files, writer: the thread)
    sharded       ShardedCheckpointer: every rank's shards through DCP (sharded_load, shard_files)
    deadline      how long a signal-forced save may take (forced: rank 0 carries the plan out)
    format        the one format version read; snapshot, rng: the state's parts
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from hpctrain.checkpoint.base import Checkpointer, CheckpointMismatch
from hpctrain.checkpoint.format import CheckpointTooNew, UnreadableFormat
from hpctrain.checkpoint.plain import PlainCheckpointer
from hpctrain.checkpoint.sharded import ShardedCheckpointer
from hpctrain.checkpoint.store import NoUsableCheckpoint
from hpctrain.config import Config, fingerprint, identity
from hpctrain.dist.context import DistContext
from hpctrain.run.events import Event

__all__ = [
    "Checkpointer",
    "CheckpointMismatch",
    "CheckpointTooNew",
    "NoUsableCheckpoint",
    "PlainCheckpointer",
    "ShardedCheckpointer",
    "UnreadableFormat",
    "checkpointer_for",
]


def checkpointer_for(
    config: Config,
    ctx: DistContext,
    folder: Path,
    record: Callable[[Event], None],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> Checkpointer:
    """The checkpointer of trainer.strategy, for `model` and `optimizer`: sharded for fsdp (no
    process holds the whole model, so none writes it whole either), plain otherwise. Rank 0 hands
    `record` each written checkpoint's and each forced save's event."""
    keep, fp, ident = config.trainer.keep_checkpoints, fingerprint(config), identity(config)
    if config.trainer.strategy == "fsdp":
        return ShardedCheckpointer(
            folder, ctx, keep, fp, on_written=record, model=model, optimizer=optimizer, identity=ident, on_forced=record
        )
    return PlainCheckpointer(
        folder, ctx, keep, fp, on_written=record, identity=ident, on_forced=record, model=model, optimizer=optimizer
    )
