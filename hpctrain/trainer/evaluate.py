"""Evaluation on the held-out split, summed over every rank so each sample counts once."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from hpctrain.dist.context import DistContext
from hpctrain.trainer.model_io import PLAIN, Contract, call, logits, own_loss, to_device


def flatten(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores [..., C] with integer targets [...] become [N, C] and [N] for the loss."""
    if output.dim() == target.dim() + 1:
        return output.reshape(-1, output.shape[-1]), target.reshape(-1)
    return output, target


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loss_fn: nn.Module,
    loader: DataLoader,
    ctx: DistContext,
    autocast: Callable[[], ContextManager[object]],
    equal_forwards: bool = False,
    contract: Contract = PLAIN,
) -> dict[str, float]:
    """`equal_forwards`: every rank runs as many forwards as the rank with the most batches (a
    sharded model's forward is a collective); the extra ones count nothing."""
    was_training = model.training
    model.eval()
    # [sum of losses, samples, correct predictions, class predictions made], kept on the device
    # until the end: one all-reduce and one host sync per evaluation.
    totals = torch.zeros(4, dtype=torch.float64, device=ctx.device)
    batches = 0
    first: tuple[torch.Tensor, ...] | None = None
    for batch in loader:
        batches += 1
        first = first or batch
        inputs, target = to_device(batch, ctx.device)
        with autocast():
            returned = call(model, inputs, target, contract)
        output, target = flatten(logits(returned).float(), target)
        count = target.shape[0]
        loss = own_loss(returned) if contract.targets_name is not None else loss_fn(output, target)
        totals[0] += loss.double() * count
        totals[1] += count
        if output.dim() == 2 and not target.is_floating_point():
            totals[2] += (output.argmax(dim=1) == target).sum()
            totals[3] += count
    if equal_forwards and ctx.distributed:
        most = torch.tensor([batches], device=ctx.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        for _ in range(int(most.item()) - batches):
            inputs, target = to_device(first if first is not None else _any_batch(loader), ctx.device)
            with autocast():
                call(model, inputs, target, contract)
    if ctx.distributed:
        dist.all_reduce(totals)
    model.train(was_training)
    loss_sum, count, correct, classified = totals.tolist()
    metrics = {"eval_loss": loss_sum / max(count, 1)}
    if classified:
        metrics["eval_accuracy"] = correct / classified
    return metrics


def _any_batch(loader: DataLoader) -> tuple[torch.Tensor, ...]:
    """One sample of the loader's dataset as a batch: the forward of a rank whose shard is empty."""
    return next(iter(DataLoader(loader.dataset, batch_size=1)))
