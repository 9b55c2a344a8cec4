"""The run's walk through its training data: how a step's batch is split (hpctrain.trainer.layout),
the loader that serves it, and how many steps the run has.

A resume at another number of processes (trainer.elastic) changes the split: `use_layout`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from hpctrain.config import Config
from hpctrain.data.splits import Splits
from hpctrain.dist.context import DistContext
from hpctrain.errors import UserError
from hpctrain.trainer import components, loaders
from hpctrain.trainer.components import Components
from hpctrain.trainer.layout import Layout
from hpctrain.trainer.state import TrainState


class Course:
    def __init__(self, config: Config, ctx: DistContext) -> None:
        self.config = config
        self.ctx = ctx
        # The configured split of a step's batch; a resume may change it (use_layout).
        self.layout = Layout(ctx.world_size, config.data.batch_size, config.trainer.grad_accum)
        # What this rank's micro-batch losses are weighted by in the layout (None: the plain mean
        # over grad_accum; hpctrain.trainer.layout), computed once per layout, not every step.
        self.loss_weights = self.layout.loss_weights(ctx.rank)
        self.train_loader: DataLoader | None = None  # opened once the data is built (`open`)
        self.total_steps = 0

    def open(self, splits: Splits) -> None:
        """The training loader of `splits`, and the run's steps."""
        self.train_loader = self._loader(splits)
        self.total_steps = self.total_steps_for(splits)

    def total_steps_for(self, splits: Splits) -> int:
        cfg = self.config.trainer
        if cfg.max_steps > 0:
            return cfg.max_steps
        samples = len(splits.train)  # type: ignore[arg-type]
        # Whole global batches (every world size alike: the sampler drops the rest).
        per_epoch = samples // self.layout.global_batch
        if per_epoch == 0:
            raise UserError(
                f"data.batch_size: the global batch of {self.layout.global_batch} samples (data.batch_size "
                f"{self.config.data.batch_size} x trainer.grad_accum {self.config.trainer.grad_accum} x the "
                f"processes of the run's first life) exceeds the {samples} training samples"
            )
        return cfg.epochs * per_epoch

    def use_layout(self, new: Layout, parts: Components) -> None:
        """Train in `new`'s layout: the loader's micro-batches, and the steps of an epoch-counted
        run (a scheduler told the total is rebuilt, before its state is loaded)."""
        self.layout = new
        self.loss_weights = new.loss_weights(self.ctx.rank)
        self.train_loader = self._loader(parts.splits)
        total = self.total_steps_for(parts.splits)
        if total != self.total_steps:
            self.total_steps = total
            # A new scheduler sets the groups' learning rate to its first step's: the rate the
            # checkpoint's optimizer state holds (loaded already) is kept.
            rates = [group["lr"] for group in parts.optimizer.param_groups]
            parts.scheduler = components.build_scheduler(self.config, parts.optimizer, total)
            for group, rate in zip(parts.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate

    def micro_batches(self, state: TrainState) -> Iterator[tuple[torch.Tensor, ...]]:
        """An endless stream of micro-batches, epoch after epoch, from `state`'s position (which
        it moves on as it goes)."""
        assert self.train_loader is not None, "open() first"
        while True:
            # Order and worker randomness are functions of the position alone (see loaders), so a
            # resumed run continues with the very batch an uninterrupted run would fetch next.
            epoch, batch_in_epoch = state.epoch, state.batch_in_epoch
            loaders.start_epoch(self.train_loader, self.config.trainer.seed, epoch, batch_in_epoch)
            for batch in self.train_loader:
                state.batch_in_epoch += 1
                yield batch
            state.epoch += 1
            state.batch_in_epoch = 0

    def _loader(self, splits: Splits) -> DataLoader:
        layout = self.layout
        return loaders.train_loader(splits.train, self.config.data, self.ctx, self.config.trainer.seed, layout)
