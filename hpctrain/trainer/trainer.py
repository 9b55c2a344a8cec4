"""The training loop: resume, then step / maybe log / maybe evaluate / maybe checkpoint / maybe
stop, then save the final checkpoint and weights.

Its parts, each in a module of its own: the model, optimizer and data built (components), the
walk through the data (course), one optimizer step (step), the resume (resume), a stop (stopping),
the checkpointer (hpctrain.checkpoint.checkpointer_for, plain or sharded: the trainer does not ask).
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpctrain import faults
from hpctrain.checkpoint import checkpointer_for, read_ahead
from hpctrain.checkpoint.memory_tier import MemoryTier
from hpctrain.checkpoint.writer import DiskFull
from hpctrain.config import Config
from hpctrain.dist.context import DistContext
from hpctrain.metrics import MetricSinks, open_sinks
from hpctrain.run.causes import CheckpointReason
from hpctrain.run.events import Finish, Journal, Pruned
from hpctrain.run.paths import RunDir
from hpctrain.trainer import components, loaders, memory_copies, sharding
from hpctrain.trainer.course import Course
from hpctrain.trainer.evaluate import evaluate
from hpctrain.trainer.hooks import EVALUATION, FIRST_STEP, SAVE, STEPS_FOLLOW, ProcessHooks
from hpctrain.trainer.progress import Progress
from hpctrain.trainer.pruning import TrialPruner
from hpctrain.trainer.resume import resume
from hpctrain.trainer.start_record import start_record
from hpctrain.trainer.state import TrainState
from hpctrain.trainer.step import Stepper
from hpctrain.trainer.stopping import Stopping, StopTraining
from hpctrain.trainer.straggler_watch import StragglerWatch
from hpctrain.trainer.weights import write_model_pt

log = logging.getLogger(__name__)

__all__ = ["StopTraining", "TrainState", "Trainer"]


class Trainer:
    def __init__(self, config: Config, ctx: DistContext, run_dir: Path, hooks: ProcessHooks) -> None:
        """`hooks`: what the training process lends (hpctrain.process.life): its stop flag, its
        watchdog (started before the rendezvous, so a peer that stops answering while the group
        forms is a hang too) and its start-up clock."""
        self.config = config
        self.ctx = ctx
        self.hooks = hooks
        self.watchdog = hooks.watchdog
        self.run = RunDir(Path(run_dir))
        self.state = TrainState()
        self.journal = Journal(self.run.events, enabled=ctx.is_main)
        self.metrics = MetricSinks()  # opened by train(), once the resumed step is known
        self.course = Course(config, ctx)
        self.parts = components.build(config, ctx, self.course.total_steps_for)
        self.course.open(self.parts.splits)
        self.eval_loader = loaders.eval_loader(self.parts.splits.eval, config.data, ctx)
        self.stepper = Stepper(self.parts, ctx, config.trainer)
        self.checkpointer = checkpointer_for(
            config, ctx, self.run.checkpoints, self.journal.write_event, self.parts.raw_model, self.parts.optimizer
        )
        # A trial of hpctrain-tune with a pruner: asked at evaluation steps (None otherwise).
        self.pruner = TrialPruner.for_run(self.run, config, ctx)
        self.stopping = Stopping(hooks, ctx, config, self.journal, self.checkpointer)
        # Made at the start, once every rank's node is known (the `start` record's gather).
        self.stragglers = StragglerWatch(ctx, self.journal, 0.0, 1, [])
        # The in-memory tier's copies (hpctrain.trainer.memory_copies); None where it is off.
        self.memory: MemoryTier | None = None

    # ---- the run -------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Train to the end (returns the final metrics) or raise StopTraining after a save."""
        parts = self.parts
        _, from_memory = memory_copies.restored(self.config, self.ctx, self.run, parts.raw_model, parts.optimizer)
        self.state = resume(
            self.checkpointer, parts, self.course, self.stepper.scaler, self.config, self.ctx, from_memory
        )
        resumed_from = "memory" if from_memory is not None else ("disk" if self.state.step else None)
        read_ahead.stop()  # resumed: whatever it has not read is not needed
        # The model built and the checkpoint loaded: progress, however long it took; the first
        # step (which may compile) has trainer.first_step_timeout_s.
        self.watchdog.beat(FIRST_STEP)
        course = self.course
        started = start_record(
            self.ctx,
            self.state.step,
            course.total_steps,
            course.layout,
            self.hooks.ready(),
            self.hooks.health,
            resumed_from,
        )
        self.journal.write_event(started)
        cfg = self.config.trainer
        nodes = [str(rank["node"]) for rank in started.ranks or []]
        self.stragglers = StragglerWatch(
            self.ctx,
            self.journal,
            cfg.straggler_threshold,
            cfg.straggler_window_steps,
            nodes,
            writing=self.checkpointer.writing,
        )
        self.stepper.timer = self.stragglers.timer
        if self.stepper.sharded_model and self.stragglers.timer is not None:
            # A rank's forwards wait in its peers' gathers: timed apart (hpctrain.trainer.straggler_watch).
            sharding.time_gathers(parts.model, self.stragglers.timer)
        elif parts.ddp is not None and self.stragglers.timer is not None:
            # A model with buffers waits in DDP's broadcast of them before each forward: timed apart.
            components.time_buffer_sync(parts.ddp, self.stragglers.timer)
        self.memory = memory_copies.tier_for(self.config, self.ctx, self.run, nodes, parts.raw_model, parts.optimizer)
        self.metrics = open_sinks(self.config, self.run.root, self.state.step, self.ctx.is_main)
        bar = self.config.trainer.progress_bar
        progress = Progress(self.ctx, course.layout.global_batch, course.total_steps, self.state.step, bar)
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
            if self.memory is not None:
                self.memory.close()

    def _train(self, progress: Progress) -> dict[str, Any]:
        """The steps, from the resumed state to the end or a stop."""
        cfg = self.config.trainer
        batches = self.course.micro_batches(self.state)
        self.stopping.start(self.state.step)
        self.parts.model.train()
        last: dict[str, Any] = {}
        while self.state.step < self.course.total_steps:
            progress.add(self.stepper.step(batches, self.course.layout.grad_accum, self.course.loss_weights))
            self.state.step += 1
            faults.point("trainer.step")
            self.watchdog.stepped()
            self.stragglers.stepped(self.state.step)
            step, final = self.state.step, self.state.step == self.course.total_steps
            evaluate_now = final or (cfg.eval_every > 0 and step % cfg.eval_every == 0)
            if evaluate_now or step % cfg.log_every == 0:
                last = self._log(progress, evaluate_now)
            if self.memory is not None and not final:
                # After the step's line: a life resumed from this copy finds the step logged
                # (rank 0's copy, which every restore needs, is made after it wrote the line).
                self.memory.stepped(step, self._state_tree)
            if evaluate_now and not final and self.pruner is not None and self.pruner.should_prune(step, last):
                return self._pruned(last)
            reason = self.stopping.poll(step)
            if reason and not final:
                self.stopping.save_and_stop(reason, step, self._state_tree())
            if cfg.ckpt_every and step % cfg.ckpt_every == 0 and not final:
                progress.pause(self._save(CheckpointReason.PERIODIC, background=cfg.async_checkpoint))
        if not last:  # resumed from the final checkpoint: nothing trained, still report the result
            self.watchdog.beat(EVALUATION)
            last = {"step": self.state.step, **self.evaluate()}
        self._save(CheckpointReason.FINAL, background=False)
        self.watchdog.beat(SAVE)  # model.pt: a gather and a write, as long as a save
        write_model_pt(self.run.model, self.parts, self.ctx)
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
        parts = self.parts
        return evaluate(
            parts.raw_model,
            parts.loss_fn,
            self.eval_loader,
            self.ctx,
            self.stepper.autocast,
            parts.sharded,
            parts.contract,
        )

    def _log(self, progress: Progress, evaluate_now: bool) -> dict[str, Any]:
        record: dict[str, Any] = progress.collect(self.state.step, self.parts.optimizer.param_groups[0]["lr"])
        if evaluate_now:
            self.watchdog.beat(EVALUATION)  # no step: trainer.eval_timeout_s, not a step's timeout
            started = time.perf_counter()
            record.update(self.evaluate())
            progress.pause(time.perf_counter() - started)
            # A long evaluation is progress, not a hang. Steps follow, each waited for as long as any
            # step; a compiled model's first may compile again (its training flag is a guard of the
            # graph): the whole trainer.hang_timeout_s for it.
            self.watchdog.beat(None if self.config.trainer.compile else STEPS_FOLLOW)
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

    # ---- checkpoints ------------------------------------------------------------------------

    def _state_tree(self) -> dict[str, Any]:
        """What a checkpoint holds besides the model and the optimizer (the checkpointer's own)."""
        scheduler, scaler = self.parts.scheduler, self.stepper.scaler
        return {
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "train": asdict(self.state),
            "layout": self.course.layout.as_dict(),
        }

    def _save(self, reason: CheckpointReason, background: bool) -> float:
        self.watchdog.beat(SAVE)  # a save is no step: trainer.save_timeout_s, not a step's timeout
        # A stop signal ends the wait for a previous write: the forced save handles that write.
        blocked = self.checkpointer.save(
            self.state.step, self._state_tree(), reason, background, stop_requested=self.stopping.requested
        )
        if not background:
            self.checkpointer.wait()
        # Steps follow a periodic save: each is waited for as long as any step.
        self.watchdog.beat(STEPS_FOLLOW if reason is CheckpointReason.PERIODIC else None)
        return blocked
