"""The training loop: resume, then step / maybe log / maybe evaluate / maybe checkpoint / maybe
stop, then save the final checkpoint and weights."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpctrain import faults
from hpctrain.checkpoint import Checkpointer, rng
from hpctrain.checkpoint.deadline import SigtermTimesReading, deadline_s, preempted_now, sigterm_s
from hpctrain.checkpoint.sharded import ShardedCheckpointer
from hpctrain.checkpoint.writer import DiskFull
from hpctrain.config import Config, fingerprint, identity
from hpctrain.data.splits import Splits
from hpctrain.dist.context import DistContext
from hpctrain.errors import UserError
from hpctrain.metrics import MetricSinks, open_sinks
from hpctrain.process import startup_clock
from hpctrain.process.signals import StopFlag
from hpctrain.process.watchdog import Watchdog, start_watchdog
from hpctrain.run.causes import CheckpointReason, StopReason
from hpctrain.run.events import Finish, Journal, Pruned, Start, Stop
from hpctrain.run.paths import RunDir
from hpctrain.trainer import components, layout, loaders, sharding
from hpctrain.trainer.evaluate import evaluate, flatten
from hpctrain.trainer.progress import Progress
from hpctrain.trainer.stop_vote import StopVote
from hpctrain.tune.prune import TrialPruner

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where the run is: with weights, optimizer and RNG, everything a resume needs."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed (this rank's shard)
    # (in the micro-batches of the run's layout: trainer.layout.moved_position converts it)


class StopTraining(Exception):
    """Raised after a signal-forced checkpoint."""

    def __init__(self, reason: StopReason, step: int) -> None:
        super().__init__(f"stopped at step {step}: {reason}")
        self.reason = reason
        self.step = step


class Trainer:
    def __init__(
        self,
        config: Config,
        ctx: DistContext,
        run_dir: Path,
        stop: StopFlag | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        # A training process starts its watchdog before the rendezvous (hpctrain.process.life),
        # so a peer that stops answering while the group forms is a hang too; built here alone.
        self.watchdog = watchdog or start_watchdog(config, ctx, Path(run_dir))
        self.config = config
        self.ctx = ctx
        self.run = RunDir(Path(run_dir))
        self.state = TrainState()
        self.stop = stop or StopFlag(config.slurm.signal)
        self.journal = Journal(self.run.events, enabled=ctx.is_main)
        self.metrics = MetricSinks()  # opened by train(), once the resumed step is known
        # The configured split of a step's batch; a resume may change it (trainer.elastic).
        self.layout = layout.Layout(ctx.world_size, config.data.batch_size, config.trainer.grad_accum)
        parts = components.build(config, ctx, self._total_steps_for)
        self.splits = parts.splits
        self.raw_model, self.model, self.ddp = parts.raw_model, parts.model, parts.ddp
        self.optimizer, self.scheduler, self.loss_fn = parts.optimizer, parts.scheduler, parts.loss_fn
        self.train_loader = loaders.train_loader(
            parts.splits.train, config.data, ctx, config.trainer.seed, self.layout.micro_batch, self.layout.grad_accum
        )
        self.eval_loader = loaders.eval_loader(parts.splits.eval, config.data, ctx)
        self.total_steps = self._total_steps_for(parts.splits)
        self.scaler = torch.amp.GradScaler("cuda") if self._precision == "fp16" else None
        # trainer.strategy=fsdp: no process holds the whole model, so none writes it whole either.
        self.sharded = config.trainer.strategy == "fsdp"
        self.sharded_model = sharding.is_sharded(self.model)  # fsdp on one process: a plain model
        self.checkpointer: Checkpointer | ShardedCheckpointer
        if self.sharded:
            self.checkpointer = ShardedCheckpointer(
                self.run.checkpoints,
                ctx,
                config.trainer.keep_checkpoints,
                fingerprint(config),
                on_written=self.journal.write_event,
                model=self.raw_model,
                optimizer=self.optimizer,
                identity=identity(config),
                on_forced=self.journal.write_event,
            )
        else:
            self.checkpointer = Checkpointer(
                self.run.checkpoints,
                ctx,
                config.trainer.keep_checkpoints,
                fingerprint(config),
                on_written=self.journal.write_event,
                identity=identity(config),
                on_forced=self.journal.write_event,
            )
        # A trial of hpctrain-tune with a pruner: asked at evaluation steps (None otherwise).
        self.pruner = TrialPruner.for_run(self.run, config, ctx)
        # What a SIGTERM gives for the forced save (GraceTime, KillWait): read once, beside the
        # start rather than before it, so a start never waits for Slurm to answer.
        self.sigterm_times = SigtermTimesReading() if ctx.is_main else None

    # ---- the run -------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Train to the end (returns the final metrics) or raise StopTraining after a save."""
        self._resume()
        self.watchdog.beat()  # the model built and the checkpoint loaded: progress, however long it took
        self._journal_start()
        self.metrics = open_sinks(self.config, self.run.root, self.state.step, self.ctx.is_main)
        cfg = self.config.trainer
        progress = Progress(self.ctx, self.layout.global_batch, self.total_steps, self.state.step, cfg.progress_bar)
        outcome = "failed"
        try:
            last = self._train(progress)
            outcome = "finished"
            return last
        except StopTraining:
            outcome = "stopped"
            raise
        finally:
            progress.close()
            self.metrics.close(outcome)

    def _train(self, progress: Progress) -> dict[str, Any]:
        """The steps, from the resumed state to the end or a stop."""
        cfg = self.config.trainer
        batches = self._micro_batches()
        vote = StopVote(self.stop, self.ctx)
        vote.start(self.state.step)
        self.model.train()
        last: dict[str, Any] = {}
        while self.state.step < self.total_steps:
            progress.add(self._step(batches))
            self.state.step += 1
            faults.point("trainer.step")
            self.watchdog.beat()
            step, final = self.state.step, self.state.step == self.total_steps
            evaluate_now = final or (cfg.eval_every > 0 and step % cfg.eval_every == 0)
            if evaluate_now or step % cfg.log_every == 0:
                last = self._log(progress, evaluate_now)
            if evaluate_now and not final and self.pruner is not None and self.pruner.should_prune(step, last):
                return self._pruned(last)
            reason = vote.poll(step)
            if reason and not final:
                self._forced_save(reason)
                raise StopTraining(reason, step)
            if cfg.ckpt_every and step % cfg.ckpt_every == 0 and not final:
                progress.pause(self._save(CheckpointReason.PERIODIC, background=cfg.async_checkpoint))
        if not last:  # resumed from the final checkpoint: nothing trained, still report the result
            last = {"step": self.state.step, **self.evaluate()}
        self._save(CheckpointReason.FINAL, background=False)
        self._save_weights()
        self.journal.write_event(Finish(step=last["step"], extra={k: v for k, v in last.items() if k != "step"}))
        self.watchdog.stop()
        return last

    def _pruned(self, last: dict[str, Any]) -> dict[str, Any]:
        """The study's pruner stopped this trial: save this step, record it, end as finished
        (the job ends COMPLETED, the control step tells the study PRUNED)."""
        assert self.pruner is not None
        self._save(CheckpointReason.PRUNED, background=False)
        metric = self.pruner.metric
        self.journal.write_event(Pruned(step=self.state.step, metric=metric, value=last.get(metric)))
        self.watchdog.stop()
        return last

    def evaluate(self) -> dict[str, float]:
        # A sharded model gathers its weights in every forward, a collective: every rank runs as
        # many forwards as the rank with the most evaluation batches.
        return evaluate(
            self.raw_model, self.loss_fn, self.eval_loader, self.ctx, self._autocast, equal_forwards=self.sharded
        )

    def _log(self, progress: Progress, evaluate_now: bool) -> dict[str, Any]:
        record: dict[str, Any] = progress.collect(self.state.step, self.optimizer.param_groups[0]["lr"])
        if evaluate_now:
            started = time.perf_counter()
            record.update(self.evaluate())
            progress.pause(time.perf_counter() - started)
            self.watchdog.beat()  # a long evaluation is progress, not a hang
        try:
            self.metrics.write(record)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A background checkpoint write that met the full disk first tells it best (its step,
            # which checkpoint is intact): wait() raises its DiskFull; else this line's own.
            self.checkpointer.wait()
            raise DiskFull(
                f"{error.filename or 'metrics.jsonl'}: {error.strerror}; free space (or raise the quota), "
                "then start the run dir again to resume"
            ) from error
        if self.ctx.is_main:
            progress.log_line(record)
        return record

    # ---- one optimizer step ----------------------------------------------------------------

    def _step(self, batches: Iterator[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        accum = self.layout.grad_accum
        step_loss: torch.Tensor | None = None
        for micro in range(accum):
            inputs, target = loaders.to_device(next(batches), self.ctx.device)
            # Only the last micro-batch all-reduces gradients; the others accumulate locally.
            if accum > 1 and self.sharded_model:
                sharding.set_gradient_sync(self.model, micro == accum - 1)
            with components.grad_sync(self.ddp, last=micro == accum - 1):
                with self._autocast():
                    output, target = flatten(self.model(inputs), target)
                    loss = self.loss_fn(output.float(), target)
                    if accum > 1:  # no extra kernel per step in the common case
                        loss = loss / accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
        self._optimizer_step()
        assert step_loss is not None  # grad_accum >= 1
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
        while True:
            # Order and worker randomness are functions of the position alone (see loaders), so a
            # resumed run continues with the very batch an uninterrupted run would fetch next.
            epoch, batch_in_epoch = self.state.epoch, self.state.batch_in_epoch
            loaders.start_epoch(self.train_loader, self.config.trainer.seed, epoch, batch_in_epoch)
            for batch in self.train_loader:
                self.state.batch_in_epoch += 1
                yield batch
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    # ---- checkpoints ------------------------------------------------------------------------

    def _state_tree(self) -> dict[str, Any]:
        # A sharded checkpointer takes the model's and the optimizer's shards itself (DCP).
        weights = (
            {} if self.sharded else {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict()}
        )
        return {
            **weights,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "train": asdict(self.state),
            "layout": self.layout.as_dict(),
        }

    def _forced_save(self, reason: StopReason) -> None:
        """The ranks agreed to stop: the `stop` record, then the save the stop forces, bounded by
        the time the signal gives (rank 0's view)."""
        sigterm_given_s = 0.0
        if reason is StopReason.PREEMPT and self.sigterm_times is not None:
            # A preemption's grace or KillWait: asked of Slurm only when the two differ.
            times = self.sigterm_times.get()
            sigterm_given_s = sigterm_s(times, preempted_now() if times.preemption_differs else False)
        since_signal_s = time.monotonic() - (self.stop.requested_at or time.monotonic())
        deadline = deadline_s(reason, since_signal_s, self.config.slurm.signal_delay_s, sigterm_given_s)
        # Before the save: a save killed half-way (a deadline missed, SIGKILL) writes nothing, and
        # the control step must still learn that the ranks had agreed to stop, and why.
        self.journal.write_event(
            Stop(
                job_id=self.ctx.life.job_id,
                restart=self.ctx.life.restart,
                step=self.state.step,
                reason=reason,
                deadline_s=None if deadline is None else round(deadline, 2),
                since_signal_s=round(since_signal_s, 3),
            )
        )
        self.checkpointer.forced_save(self.state.step, self._state_tree(), reason, deadline)
        self.watchdog.beat()

    def _save(self, reason: CheckpointReason, background: bool) -> float:
        # A stop signal ends the wait for a previous write: the forced save handles that write.
        blocked = self.checkpointer.save(
            self.state.step, self._state_tree(), reason, background, stop_requested=lambda: self.stop.requested > 0
        )
        if not background:
            self.checkpointer.wait()
        self.watchdog.beat()
        return blocked

    def _resume(self) -> None:
        # A sharded checkpoint is loaded into the model and the optimizer by the checkpointer.
        saved = self.checkpointer.load(expect_model=None if self.sharded else self.raw_model.state_dict())
        if saved is None:
            return
        faults.point("trainer.resume_loading")
        state = TrainState(**saved["train"])
        saved_layout = self._saved_layout(saved)
        cfg = self.config
        resumed_layout = layout.resumed(
            saved_layout, self.ctx.world_size, cfg.data.batch_size, cfg.trainer.elastic, state.step
        )
        state.batch_in_epoch = layout.moved_position(state.batch_in_epoch, saved_layout, resumed_layout)
        if resumed_layout != self.layout:
            self._use_layout(resumed_layout)
        if not self.sharded:
            self.raw_model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
        if self.scheduler is not None and saved["scheduler"] is not None:
            self.scheduler.load_state_dict(saved["scheduler"])
        if self.scaler is not None and saved["scaler"] is not None:
            self.scaler.load_state_dict(saved["scaler"])
        self.state = state
        # At a new size a rank beyond the saved ones keeps its fresh per-rank seed (components).
        if saved["rng"] is not None:
            rng.restore(saved["rng"])
        log.info("resumed from step %d (epoch %d)", self.state.step, self.state.epoch)
        if saved_layout.world_size != self.ctx.world_size:
            log.info(
                "resumed at another size: %d processes instead of %d; the global batch stays %d samples "
                "(%d per micro-batch x %d micro-batches a step on each process)",
                self.ctx.world_size,
                saved_layout.world_size,
                self.layout.global_batch,
                self.layout.micro_batch,
                self.layout.grad_accum,
            )

    def _saved_layout(self, saved: dict[str, Any]) -> layout.Layout:
        """The layout a checkpoint was written in. Checkpoints before format 3 do not say: theirs
        was the config's batch and accumulation (the fingerprint holds both) at their world size."""
        if saved.get("layout"):
            return layout.Layout.from_dict(saved["layout"])
        cfg = self.config
        world_size = saved.get("world_size") or self.ctx.world_size
        return layout.Layout(world_size, cfg.data.batch_size, cfg.trainer.grad_accum)

    def _use_layout(self, new: layout.Layout) -> None:
        """Train in `new`'s layout: the loader's micro-batches, and the steps of an epoch-counted
        run (a scheduler told the total is rebuilt, before its state is loaded)."""
        self.layout = new
        cfg = self.config
        seed = cfg.trainer.seed
        self.train_loader = loaders.train_loader(
            self.splits.train, cfg.data, self.ctx, seed, new.micro_batch, new.grad_accum
        )
        total = self._total_steps_for(self.splits)
        if total != self.total_steps:
            self.total_steps = total
            # A new scheduler sets the groups' learning rate to its first step's: the rate the
            # checkpoint's optimizer state holds (a sharded one is loaded already) is kept.
            rates = [group["lr"] for group in self.optimizer.param_groups]
            self.scheduler = components.build_scheduler(cfg, self.optimizer, total)
            for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate

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
        samples = len(splits.train)  # type: ignore[arg-type]
        # Whole global batches (every world size alike: the sampler drops the rest).
        per_epoch = samples // self.layout.global_batch
        if per_epoch == 0:
            raise UserError(
                f"data.batch_size: {self.layout.micro_batch} x trainer.grad_accum {self.layout.grad_accum} "
                f"x {self.layout.world_size} processes exceeds the {samples} training samples"
            )
        return cfg.epochs * per_epoch

    def _journal_start(self) -> None:
        startup_clock.mark("ready")
        # Every rank reports where it runs, which GPU it binds and which CPUs it may run on (Slurm's
        # task/affinity pins each task to its slurm.cpus_per_task CPUs), so the journal shows the layout.
        mine = {
            "node": self.ctx.node or socket.gethostname(),
            "gpu": self.ctx.gpu,
            "device": str(self.ctx.device),
            # None where the OS cannot say (macOS has no sched_getaffinity).
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        }
        ranks: list[Any] = [mine]
        if self.ctx.distributed:
            ranks = [None] * self.ctx.world_size
            dist.all_gather_object(ranks, mine)
        self.journal.write_event(
            Start(
                job_id=self.ctx.life.job_id,
                restart=self.ctx.life.restart,
                world_size=self.ctx.world_size,
                nodes=sorted({r["node"] for r in ranks}),
                resumed_from_step=self.state.step,
                total_steps=self.total_steps,
                ranks=ranks,
                allocated_at=self.ctx.life.allocated_at,
                startup=startup_clock.phases() or None,
                layout=self.layout.as_dict(),
                # What the allocation holds, for what a run costs (hpctrain-status): Slurm's own
                # counts, as this life's step sees them.
                job_nodes=self.ctx.life.job_nodes,
                gpus_per_node=self.ctx.life.gpus_on_node,
            )
        )

    def _save_weights(self) -> None:
        """model.pt: a plain state_dict on CPU, no `module.` prefix, written atomically."""
        if self.sharded:  # gathered to rank 0 (collective), one tensor at a time
            weights = sharding.full_weights(self.raw_model)
        elif self.ctx.is_main:
            weights = {k: v.detach().cpu() for k, v in self.raw_model.state_dict().items()}
        if not self.ctx.is_main:
            return
        tmp = self.run.model.with_name("model.pt.tmp")
        torch.save(weights, tmp)
        os.replace(tmp, self.run.model)
