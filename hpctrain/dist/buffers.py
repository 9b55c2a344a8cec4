"""A sharded model's buffers (BatchNorm's running statistics) the same on every rank: rank 0's.

FSDP shards parameters, never buffers: each rank would keep its own running statistics, and a
checkpoint would hold whichever rank's copy it took. As DDP does (broadcast_buffers), every rank
computes with rank 0's: they are broadcast before each forward (`keep_rank0s`: one call per dtype;
a BatchNorm updates them during its forward, where autograd must find them untouched), and before
every checkpoint and model.pt (`sync_from_rank0`), so a resumed run goes on with the buffers the
uninterrupted one had. Here, not in the trainer: the checkpoint calls it too.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def keep_rank0s(model: nn.Module) -> None:
    """Every forward of `model` starts from rank 0's buffers (none: nothing to do)."""
    if _buffers(model):
        model.register_forward_pre_hook(lambda module, args: sync_from_rank0(module))


def sync_from_rank0(model: nn.Module) -> None:
    """Collective where there are buffers and processes: every rank takes rank 0's buffers."""
    found = _buffers(model)
    if not found or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for buffer in found:
        by_dtype.setdefault(buffer.dtype, []).append(buffer)
    with torch.no_grad():
        for group in by_dtype.values():
            flat = torch.cat([b.reshape(-1) for b in group])
            dist.broadcast(flat, src=0)
            offset = 0
            for b in group:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()


def _buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if b.numel()]
