"""trainer.strategy=fsdp: the model sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each unit (by default every module held in an nn.ModuleList: a transformer's blocks) is sharded
on its own, so its full parameters exist only while it computes; the root takes the rest
(embeddings, final norm, head), which keeps tied weights (a GPT's embedding and head) in one
unit, as FSDP requires. Parameters, gradients and optimizer state are then DTensors holding
1/world_size of each tensor (dim 0), and a step reduce-scatters gradients instead of
all-reducing them.

With trainer.hsdp the mesh is 2-D: shard within a node, replicate across nodes (HSDP).
On GPU, trainer.precision sets FSDP's mixed precision: parameters gathered and computed in bf16,
gradients reduced in fp32; the sharded parameters and the optimizer state stay fp32.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from hpctrain.config import TrainerConfig
from hpctrain.dist import buffers
from hpctrain.dist.context import DistContext
from hpctrain.errors import UserError

if TYPE_CHECKING:
    from hpctrain.trainer.straggler_watch import OwnWorkTimer

log = logging.getLogger(__name__)


def units(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The submodules sharded as units of their own, innermost last (fully_shard goes bottom-up):
    those of the classes `names`; with none named, those of the classes a Hugging Face model
    lists in `_no_split_modules` (its own word for its blocks), else the blocks: the modules held
    in an nn.ModuleList or nn.Sequential next to others of their class (a transformer's layers,
    timm's `blocks` and ResNet stages), each with parameters of its own."""
    if not names:
        names = [str(n) for n in getattr(model, "_no_split_modules", None) or []]
        names = [n for n in names if any(type(m).__name__ == n for m in model.modules())]
    if names:
        known = {type(m).__name__ for m in model.modules()}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UserError(
                f"trainer.fsdp_units: {', '.join(unknown)} is not a class in this model "
                f"(its classes: {', '.join(sorted(known)[:12])}{' ...' if len(known) > 12 else ''})"
            )
        found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    else:
        found = _blocks([m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential))])
    # A unit inside another unit is sharded first (FSDP wants the inner ones wrapped before).
    return sorted(found, key=lambda m: -_depth(model, m))


def _blocks(containers: list[nn.Module]) -> list[nn.Module]:
    """The containers' children that are blocks: every child of a ModuleList; in a Sequential,
    the children whose class repeats among all the containers' children (a ResNet's stages of one
    block each still hold four blocks of one class), never single layers (a head, a norm) nor
    containers (a stage: its blocks are the units)."""
    held = [
        (container, child)
        for container in containers
        for child in container.children()
        if any(True for _ in child.parameters())
    ]
    counts: dict[type, int] = {}
    for _, child in held:
        counts[type(child)] = counts.get(type(child), 0) + 1
    return [
        child
        for container, child in held
        if isinstance(container, nn.ModuleList)
        or (counts[type(child)] > 1 and not isinstance(child, _LEAF_LAYERS + _CONTAINERS))
    ]


# A container is no block of its own: its children are looked at instead (a stage of blocks).
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


# Single layers are no unit of their own: a Sequential of Linear layers is an MLP, one unit.
_LEAF_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding, nn.LayerNorm, nn.BatchNorm2d, nn.Dropout)


def describe_units(model: nn.Module, found: list[nn.Module]) -> str:
    """`12 x Block` style words for the start's log line."""
    counts: dict[str, int] = {}
    for unit in found:
        counts[type(unit).__name__] = counts.get(type(unit).__name__, 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in counts.items()) or "none"


def _depth(root: nn.Module, module: nn.Module) -> int:
    for name, candidate in root.named_modules():
        if candidate is module:
            return name.count(".") + 1
    return 0


def mesh_shape(ctx: DistContext, hsdp: bool) -> tuple[int, ...]:
    """(world,) to shard over every process, or (nodes, processes per node) for HSDP."""
    if not hsdp:
        return (ctx.world_size,)
    per_node = ctx.local_world_size
    if per_node < 1 or ctx.world_size % per_node:
        raise UserError(
            f"trainer.hsdp: {ctx.world_size} processes do not split into nodes of {per_node}; "
            "give every node the same number of tasks, or set trainer.hsdp=false"
        )
    return (ctx.world_size // per_node, per_node)


def shard(model: nn.Module, trainer: TrainerConfig, ctx: DistContext) -> nn.Module:
    """Shard `model` in place (it becomes an FSDPModule) and return it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shape = mesh_shape(ctx, trainer.hsdp)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)
    options: dict[str, Any] = {"mesh": mesh}
    if ctx.device.type == "cuda" and trainer.precision == "bf16":
        # Gathered and computed in bf16, reduced in fp32: the usual recipe (torchtitan's too).
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    found = units(model, list(trainer.fsdp_units))
    if found:
        log.info("fsdp units: %s, and the root (the rest)", describe_units(model, found))
    else:
        log.warning(
            "trainer.strategy=fsdp: no block found in %s: the whole model is one unit, every parameter "
            "gathered at once; name its block class in trainer.fsdp_units",
            type(model).__name__,
        )
    for unit in found:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    buffers.keep_rank0s(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def time_gathers(model: nn.Module, timer: OwnWorkTimer) -> None:
    """Each unit's gather before its forward timed as a wait (`timer.wait_begins()`,
    `timer.wait_ends()`: hpctrain.trainer.straggler_watch.OwnWorkTimer): a rank waits there for
    its slowest peer, so its own work is its forward without it. FSDP's own pre-forward hook (the
    unit's all-gather issued and waited for) was registered first, at the front: one hook put
    before it and one after it bracket it."""
    from torch.distributed.fsdp import FSDPModule

    begins = torch.compiler.disable(lambda *_: timer.wait_begins())
    ends = torch.compiler.disable(lambda *_: timer.wait_ends())
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.register_forward_pre_hook(begins, prepend=True)
            unit.register_forward_pre_hook(ends)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Micro-batches before a step's last keep their gradients unreduced (FSDP's no_sync)."""
    model.set_requires_gradient_sync(sync)  # type: ignore[operator]


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective. The whole model as a plain CPU state_dict on rank 0 (the others get {}): the
    keys of the unwrapped model, loadable without hpctrain (model.pt)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    buffers.sync_from_rank0(model)  # rank 0's, as every rank computes with them
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))


def local_bytes(tensors: Any) -> int:
    """Bytes this process holds of `tensors` (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total
