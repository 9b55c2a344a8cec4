"""One optimizer step: the micro-batches' forwards and backwards, then the update."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch

from hpctrain.config import TrainerConfig
from hpctrain.dist.context import DistContext
from hpctrain.trainer import components, first_checks, model_io, sharding
from hpctrain.trainer.components import Components
from hpctrain.trainer.evaluate import flatten
from hpctrain.trainer.straggler_watch import OwnWorkTimer


class Stepper:
    def __init__(self, parts: Components, ctx: DistContext, trainer: TrainerConfig) -> None:
        self.parts = parts
        self.ctx = ctx
        self.grad_clip = trainer.grad_clip
        self.precision = trainer.precision if ctx.device.type == "cuda" else "fp32"
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None
        self.sharded_model = sharding.is_sharded(parts.model)  # fsdp on one process: a plain model
        self.first = True  # this life's first micro-batch: its mistakes said (first_checks)
        # Times each step's own work for the straggler watch (hpctrain.trainer.straggler_watch).
        self.timer: OwnWorkTimer | None = None

    def autocast(self) -> ContextManager[Any]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.ctx.device.type, dtype=dtype)

    def step(
        self, batches: Iterator[tuple[torch.Tensor, ...]], accum: int, weights: list[float] | None = None
    ) -> torch.Tensor:
        """`accum` micro-batches from `batches`, then the update; returns the step's loss (on the
        device: no host sync). `weights`: each micro-batch's weight where the layout's micro-batches
        differ in size (hpctrain.trainer.layout.loss_weights); None: the mean of the `accum`."""
        parts = self.parts
        step_loss: torch.Tensor | None = None
        if self.timer is not None:
            self.timer.begin()
        for micro in range(accum):
            inputs, target = model_io.to_device(next(batches), self.ctx.device)
            # Only the last micro-batch all-reduces gradients; the others accumulate locally.
            if accum > 1 and self.sharded_model:
                sharding.set_gradient_sync(parts.model, micro == accum - 1)
            with components.grad_sync(parts.ddp, last=micro == accum - 1):
                with self.autocast(), self._checked():
                    loss = self.loss(model_io.call(parts.model, inputs, target, parts.contract), target)
                    if weights is not None:
                        loss = loss * weights[micro]
                    elif accum > 1:  # no extra kernel per step in the common case
                        loss = loss / accum
                self.first = False
                # What follows waits on the peers: plain, the last backward (the gradients'
                # reduction); sharded, every backward (it gathers the parameters again).
                if self.timer is not None and micro == (0 if self.sharded_model else accum - 1):
                    self.timer.end()
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        self._update()
        assert step_loss is not None  # grad_accum >= 1
        return step_loss

    def loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The model's own loss (it was given the targets), else `loss` on its scores."""
        if self.parts.contract.targets_name is not None:
            return model_io.own_loss(output).float()
        scores, target = flatten(model_io.logits(output), target)
        if self.first:
            first_checks.check_scores(scores, target)
        return self.parts.loss_fn(scores.float(), target)

    def _checked(self) -> ContextManager[Any]:
        """The first micro-batch's embeddings checked (hpctrain.trainer.first_checks)."""
        # A compiled model would be compiled again once the hooks are gone: its scores are checked.
        compiled = hasattr(self.parts.model, "_orig_mod")
        if not self.first or compiled:
            return contextlib.nullcontext()
        return first_checks.embeddings_checked(self.parts.raw_model)

    def _update(self) -> None:
        parts = self.parts
        if self.scaler:
            self.scaler.unscale_(parts.optimizer)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(parts.raw_model.parameters(), self.grad_clip)
        if self.scaler:
            self.scaler.step(parts.optimizer)
            self.scaler.update()
        else:
            parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
        if parts.scheduler is not None:
            parts.scheduler.step()
