"""model.pt: the trained model's weights, whole, for use without hpctrain."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from hpctrain.dist.context import DistContext
from hpctrain.run import fencing
from hpctrain.trainer import sharding
from hpctrain.trainer.components import Components


def write_model_pt(path: Path, parts: Components, ctx: DistContext) -> None:
    """Collective for a sharded model. A plain state_dict on CPU, no `module.` prefix, written
    atomically by rank 0."""
    if parts.sharded:  # gathered to rank 0 (collective), one tensor at a time
        weights = sharding.full_weights(parts.raw_model)
    elif ctx.is_main:
        weights = {k: v.detach().cpu() for k, v in parts.raw_model.state_dict().items()}
    if not ctx.is_main:
        return
    fencing.check(path.parent)  # a replaced life leaves model.pt to the new one
    tmp = path.with_name(path.name + ".tmp")
    torch.save(weights, tmp)
    fencing.check(path.parent)
    os.replace(tmp, path)
