"""A rank's own shards of a sharded model's state as plain tensors, and back in place.

With trainer.strategy=fsdp the model's parameters and the optimizer's state are DTensors: each
rank holds 1/world_size of each tensor. The in-memory tier copies each rank's state to the memory
holders and gives it back to the same rank of a world of the same size (a relaunch on a spare;
hpctrain.trainer.memory_copies refuses another world), so a rank's copy is its local shards
alone: no collective (a rank may skip a copy its peers make), no gather of the whole model.

- `local`: the state dicts' DTensors replaced by their local tensors (views: the snapshot copies);
- `load_model` / `load_optimizer`: a copy's local tensors made into the live model's and
  optimizer's DTensors again, on the mesh and with the placements of the parameters they belong
  to, and loaded the way a plain state dict is.

For a model that is not sharded every function here is the identity: the tier stores and loads
plain state dicts, as it always did.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def local(tree: Any) -> Any:
    """`tree` with each DTensor replaced by this rank's shard of it (a plain tensor)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {key: local(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [local(value) for value in tree]
        return items if isinstance(tree, list) else tuple(items)
    return tree


def _like(saved: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """The saved shard as a DTensor shaped as `live` is, or as it is where `live` is not one."""
    if not isinstance(live, DTensor):
        return saved
    if tuple(saved.shape) != tuple(live.to_local().shape):
        raise ValueError(
            f"a memory copy's shard is {tuple(saved.shape)}, this rank's is {tuple(live.to_local().shape)}"
        )
    shard = saved.to(device=live.device, dtype=live.dtype)
    return DTensor.from_local(
        shard, live.device_mesh, live.placements, run_check=False, shape=live.shape, stride=live.stride()
    )


def load_model(model: nn.Module, saved: dict[str, Any]) -> None:
    """A copy's model state (plain or local shards) loaded into `model`."""
    live = model.state_dict()
    model.load_state_dict(
        {
            key: _like(value, live[key]) if key in live and isinstance(value, torch.Tensor) else value
            for key, value in saved.items()
        }
    )


def unsupported(optimizer: torch.optim.Optimizer) -> str | None:
    """Why a copy of this optimizer's state could not be given back as local shards (None: it can):
    a state tensor of a sharded parameter that is not sharded as the parameter is (a factored
    second moment) would not be known again from its shard."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            for name, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    same = isinstance(value, DTensor) and value.placements == param.placements
                    if not same or value.shape != param.shape:
                        return f"its state {name!r} is not sharded as its parameter is"
    return None


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A copy's optimizer state (plain or local shards) loaded into `optimizer`: each state tensor
    shaped as its parameter's shard is made a DTensor like that parameter (Adam's moments); the
    rest (a step count) stays as saved."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {}
    for index, entries in saved["state"].items():
        param = params[int(index)]
        state[index] = {
            name: _like(value, param)
            if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.dim() > 0
            else value
            for name, value in entries.items()
        }
    optimizer.load_state_dict({**saved, "state": state})
