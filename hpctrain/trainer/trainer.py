"""The training loop: build, then step / maybe log / maybe evaluate, then save the weights."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed as dist

from hpctrain.config import Config
from hpctrain.data.splits import Splits
from hpctrain.dist import DistContext
from hpctrain.journal import JsonLines, Journal
from hpctrain.rundir import RunDir
from hpctrain.trainer import components, loaders
from hpctrain.trainer.evaluate import evaluate, flatten
from hpctrain.trainer.progress import Progress

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where the run is: everything besides weights and optimizer that a resume needs."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed (this rank's shard)


class Trainer:
    def __init__(self, config: Config, ctx: DistContext, run_dir: Path) -> None:
        self.config = config
        self.ctx = ctx
        self.run = RunDir(Path(run_dir))
        self.state = TrainState()
        self.journal = Journal(self.run.events, enabled=ctx.is_main)
        self.metrics = JsonLines(self.run.metrics, enabled=ctx.is_main)
        parts = components.build(config, ctx, self._total_steps_for)
        self.raw_model, self.model = parts.raw_model, parts.model
        self.optimizer, self.scheduler, self.loss_fn = parts.optimizer, parts.scheduler, parts.loss_fn
        self.train_loader = loaders.train_loader(parts.splits.train, config.data, ctx, config.trainer.seed)
        self.eval_loader = loaders.eval_loader(parts.splits.eval, config.data, ctx)
        self.total_steps = self._total_steps_for(parts.splits)
        self.scaler = torch.amp.GradScaler("cuda") if self._precision == "fp16" else None

    # ---- the run -------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Train to the end; returns the final metrics."""
        self._journal_start()
        cfg = self.config.trainer
        samples_per_step = self.config.data.batch_size * cfg.grad_accum * self.ctx.world_size
        progress = Progress(self.ctx, samples_per_step, self.total_steps)
        batches = self._micro_batches()
        self.model.train()
        last: dict[str, Any] = {}
        while self.state.step < self.total_steps:
            progress.add(self._step(batches))
            self.state.step += 1
            step, final = self.state.step, self.state.step == self.total_steps
            evaluate_now = final or (cfg.eval_every > 0 and step % cfg.eval_every == 0)
            if evaluate_now or step % cfg.log_every == 0:
                last = progress.collect(step, self.optimizer.param_groups[0]["lr"])
                if evaluate_now:
                    started = time.perf_counter()
                    last.update(self.evaluate())
                    progress.pause(time.perf_counter() - started)
                self.metrics.write(last)
                if self.ctx.is_main:
                    progress.log_line(last)
        self._save_weights()
        self.journal.event("finish", **last)
        return last

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.raw_model, self.loss_fn, self.eval_loader, self.ctx, self._autocast)

    # ---- one optimizer step ----------------------------------------------------------------

    def _step(self, batches: Iterator[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        accum = self.config.trainer.grad_accum
        step_loss = torch.zeros((), device=self.ctx.device)
        for micro in range(accum):
            inputs, target = loaders.to_device(next(batches), self.ctx.device)
            # Only the last micro-batch all-reduces gradients; the others accumulate locally.
            sync = micro == accum - 1 or not isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
            with contextlib.nullcontext() if sync else self.model.no_sync():  # type: ignore[operator]
                with self._autocast():
                    output, target = flatten(self.model(inputs), target)
                    loss = self.loss_fn(output.float(), target) / accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            step_loss += loss.detach()
        self._optimizer_step()
        return step_loss

    def _optimizer_step(self) -> None:
        clip = self.config.trainer.grad_clip
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()

    def _micro_batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """An endless stream of micro-batches, epoch after epoch, from the state's position."""
        sampler = self.train_loader.sampler
        assert isinstance(sampler, loaders.TrainSampler)
        batch_size = self.config.data.batch_size
        while True:
            sampler.set_epoch(self.state.epoch)
            sampler.start_at = self.state.batch_in_epoch * batch_size
            for batch in self.train_loader:
                self.state.batch_in_epoch += 1
                yield batch
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    # ---- helpers -----------------------------------------------------------------------------

    @property
    def _precision(self) -> str:
        return self.config.trainer.precision if self.ctx.device.type == "cuda" else "fp32"

    def _autocast(self) -> ContextManager[Any]:
        if self._precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self._precision == "bf16" else torch.float16
        return torch.autocast(self.ctx.device.type, dtype=dtype)

    def _total_steps_for(self, splits: Splits) -> int:
        cfg = self.config.trainer
        if cfg.max_steps > 0:
            return cfg.max_steps
        per_rank = len(splits.train) // self.ctx.world_size  # type: ignore[arg-type]
        per_epoch = per_rank // self.config.data.batch_size // cfg.grad_accum
        if per_epoch == 0:
            raise ValueError(
                f"data.batch_size: {self.config.data.batch_size} x trainer.grad_accum {cfg.grad_accum} "
                f"x {self.ctx.world_size} processes exceeds the {len(splits.train)} training samples"  # type: ignore[arg-type]
            )
        return cfg.epochs * per_epoch

    def _journal_start(self) -> None:
        # Every rank reports where it runs and which GPU it binds, so the journal shows the layout.
        mine = {"node": self.ctx.node or socket.gethostname(), "gpu": self.ctx.gpu, "device": str(self.ctx.device)}
        ranks: list[Any] = [mine]
        if self.ctx.distributed:
            ranks = [None] * self.ctx.world_size
            dist.all_gather_object(ranks, mine)
        self.journal.event(
            "start",
            job_id=os.environ.get("SLURM_JOB_ID"),
            restart=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            world_size=self.ctx.world_size,
            nodes=sorted({r["node"] for r in ranks}),
            resumed_from_step=self.state.step,
            total_steps=self.total_steps,
            ranks=ranks,
        )

    def _save_weights(self) -> None:
        """model.pt: a plain state_dict on CPU, no `module.` prefix, written atomically."""
        if not self.ctx.is_main:
            return
        weights = {k: v.detach().cpu() for k, v in self.raw_model.state_dict().items()}
        tmp = self.run.model.with_name("model.pt.tmp")
        torch.save(weights, tmp)
        os.replace(tmp, self.run.model)
