"""Resume: the newest checkpoint's state put back in place, at this run's number of processes.

The checkpointer loads the model and the optimizer itself (plain or sharded alike); here the
rest: the data position, moved into this run's layout when the number of processes changed
(trainer.elastic, hpctrain.trainer.layout), the scheduler, the scaler, and this rank's RNG.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hpctrain import faults
from hpctrain.checkpoint import Checkpointer, rng
from hpctrain.config import Config
from hpctrain.dist.context import DistContext
from hpctrain.trainer import layout
from hpctrain.trainer.components import Components
from hpctrain.trainer.course import Course
from hpctrain.trainer.state import TrainState

log = logging.getLogger(__name__)


def resume(
    checkpointer: Checkpointer,
    parts: Components,
    course: Course,
    scaler: torch.amp.GradScaler | None,
    config: Config,
    ctx: DistContext,
    from_memory: dict[str, Any] | None = None,
) -> TrainState:
    """Collective. Where the newest checkpoint left the run, its state loaded into the parts;
    a fresh TrainState when there is none. `from_memory`: the state the in-memory tier restored
    (its model and optimizer already loaded, hpctrain.trainer.memory_copies), used instead."""
    saved = checkpointer.load() if from_memory is None else from_memory
    if saved is None:
        return TrainState()
    faults.point("trainer.resume_loading")
    state = TrainState(**saved["train"])
    saved_layout = layout.Layout.from_dict(saved["layout"])
    resumed_layout = layout.resumed(
        saved_layout, ctx.world_size, config.data.batch_size, config.trainer.elastic, state.step
    )
    state.batch_in_epoch = layout.moved_position(state.batch_in_epoch, saved_layout, resumed_layout)
    if resumed_layout != course.layout:
        course.use_layout(resumed_layout, parts)
    if parts.scheduler is not None and saved["scheduler"] is not None:
        parts.scheduler.load_state_dict(saved["scheduler"])
    if scaler is not None and saved["scaler"] is not None:
        scaler.load_state_dict(saved["scaler"])
    # At a new size a rank beyond the saved ones keeps its fresh per-rank seed (components).
    if saved["rng"] is not None:
        rng.restore(saved["rng"])
    log.info("resumed from step %d (epoch %d)", state.step, state.epoch)
    if saved_layout.world_size != ctx.world_size:
        now = course.layout
        log.info(
            "resumed at another size: %d processes instead of %d; the global batch stays %d samples "
            "(%d per micro-batch x %d micro-batches a step on each process)",
            ctx.world_size,
            saved_layout.world_size,
            now.global_batch,
            now.micro_batch,
            now.grad_accum,
        )
    return state
