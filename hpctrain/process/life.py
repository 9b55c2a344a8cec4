"""One training process's life: join the group, train, always clean up (hpctrain.worker starts it).

Exit codes (hpctrain.run.exitcodes): WORKER_FINISHED; after a signal-forced checkpoint (or a stop
that came before training started: nothing to save) the stop's own, WORKER_SAVED_FOR_TIMELIMIT or
WORKER_SAVED_AND_STOPPED (hpctrain.run.causes.STOP_TABLE); WORKER_USER_ERROR after a user's
mistake (checkpoints of another model, a missing data file), told as one `error:` line and a
`failure` event (cause `user_error`), which the batch script does not retry.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from pathlib import Path

import torch

from hpctrain import faults, logs
from hpctrain.checkpoint import NoUsableCheckpoint, read_ahead
from hpctrain.config import load_run_config
from hpctrain.dist import collective_records
from hpctrain.dist import context as hdist
from hpctrain.dist.context import DistContext
from hpctrain.errors import UserError
from hpctrain.process import early_stop, ending, node_health, startup_clock
from hpctrain.process.early_signals import EarlySignals
from hpctrain.process.health_start import node_checks, timed_allreduce
from hpctrain.process.signals import StopFlag
from hpctrain.process.watchdog import start_watchdog
from hpctrain.run import fencing
from hpctrain.run.causes import STOP_TABLE, Cause, StopReason
from hpctrain.run.events import Failure, Journal
from hpctrain.run.exitcodes import WORKER_FENCED, WORKER_FINISHED, WORKER_NODE_UNHEALTHY, WORKER_USER_ERROR
from hpctrain.run.paths import RunDir, no_room, no_room_message
from hpctrain.slurm.env import SlurmEnvError
from hpctrain.trainer.hooks import ProcessHooks
from hpctrain.trainer.stopping import StopTraining
from hpctrain.trainer.trainer import Trainer

log = logging.getLogger(__name__)


def run(run_dir: Path, ctx: DistContext, early: EarlySignals | None = None) -> StopReason | None:
    """Train; returns None when finished, or the stop reason after a signal-forced save (or a
    stop signal held in `early`, which came before this process could train). A user's mistake
    is reported here and raised again as UserError."""
    logs.setup(ctx.rank)
    # What the imports made (torch, the trainer: about a million objects) lives as long as the
    # process: out of the collector's sight, a full collection scans only what training makes
    # (0.15 s of CPU -> microseconds, at the end below and at every full collection in training).
    gc.freeze()
    try:
        return _run(run_dir, ctx, early)
    except (UserError, NoUsableCheckpoint) as error:
        _report(error, run_dir, ctx)
        if isinstance(error, UserError):
            raise
        raise UserError(str(error)) from error
    except OSError as error:
        # The run dir's disk or quota full where the journal or the metrics are written (the
        # checkpoint writer reports its own): the user's to fix, told in one line, not retried.
        if not no_room(error):
            raise
        full = UserError(no_room_message(run_dir, error))
        _report(full, run_dir, ctx, told_no_room=True)
        raise full from error


def _report(error: Exception, run_dir: Path, ctx: DistContext, told_no_room: bool = False) -> None:
    if not ctx.is_main:  # every rank fails alike; rank 0 tells it
        log.error("%s", error)
        return
    print(f"error: {error}", file=sys.stderr, flush=True)
    try:
        Journal(RunDir(run_dir).events).write_event(
            Failure(
                job_id=ctx.life.job_id,
                restart=ctx.life.restart,
                cause=Cause.USER_ERROR,
                message=str(error),
            )
        )
    except OSError as unwritten:  # the error may be this very disk being full
        if not no_room(unwritten):
            raise
        if not told_no_room:
            print(f"error: {no_room_message(run_dir, unwritten)}", file=sys.stderr, flush=True)


def _run(run_dir: Path, ctx: DistContext, early: EarlySignals | None) -> StopReason | None:
    faults.set_rank(ctx.rank)
    config = load_run_config(run_dir)
    # Handlers first: a signal from here on is honoured at the first step boundary.
    stop = StopFlag(config.slurm.signal)
    stop.install()
    if early is not None:
        early.hand_over(set(stop.signal_names), stop.note)
        came_early = stop.agreed_alone()
        if came_early is not None:
            return _stop_before_training(run_dir, ctx, came_early, stop)
    # From here on a process that makes no progress for trainer.hang_timeout_s is a hang: a peer
    # stopped before it joined keeps the others in the rendezvous, which would otherwise wait
    # trainer.collective_timeout_s (longer, by the schema) and end as a crash.
    watchdog = start_watchdog(config, ctx, run_dir)
    try:
        health = node_checks(config, run_dir, ctx)
    except BaseException:
        watchdog.stop()
        raise
    faults.point("worker.before_rendezvous")
    # The newest checkpoint read and hashed while the peers meet and the model is built.
    read_ahead.start(RunDir(run_dir).checkpoints, ctx.rank, ctx.world_size)
    # Threads before any work: the count is part of what makes a run bit-reproducible.
    torch.set_num_threads(config.trainer.threads)
    if config.trainer.deterministic:
        deterministic_kernels()
    collective_records.enable(config.trainer.collective_records)  # read as the group forms
    try:
        hdist.init_process_group(
            ctx, config.trainer.backend, config.trainer.collective_timeout_s, run_dir, config.slurm.network
        )
    except BaseException:
        watchdog.stop()
        raise
    ending.trained_here()
    if "allreduce" in config.slurm.health.checks and ctx.world_size > 1:
        health.update(timed_allreduce(ctx))
    startup_clock.mark("joined")
    watchdog.beat()  # each stage of a start done is progress: a slow start on a loaded node is no hang
    trainer = None
    try:
        log.info("rank %d/%d on %s (%s), run dir %s", ctx.rank, ctx.world_size, ctx.device, ctx.source, run_dir)
        trainer = Trainer(config, ctx, run_dir, ProcessHooks(stop, watchdog, ready=_ready, health=health))
        trainer.train()
        return None
    except StopTraining as stopped:
        log.info("%s; checkpoint saved, resume by starting the run dir again", stopped)
        return stopped.reason
    finally:
        # A DDP model still alive at interpreter shutdown can abort the process ("terminate
        # called without an active exception"): free it before the process group goes.
        del trainer
        gc.collect()
        hdist.destroy_process_group()
        watchdog.stop()


def _ready() -> dict[str, float]:
    """The trainer is ready to train: the start-up's last moment, and its phases."""
    startup_clock.mark("ready")
    return startup_clock.phases()


def _stop_before_training(run_dir: Path, ctx: DistContext, reason: StopReason, stop: StopFlag) -> StopReason:
    """A stop signal came while this process was still importing (after its launcher had
    looked: hpctrain.process.early_stop): journaled, and this process leaves before the rendezvous."""
    early_stop.journal_stop(run_dir, ctx.life, ctx.rank, reason, stop)
    return reason


def spawned(local_rank: int, nprocs: int, store_path: str, run_dir: str, early: EarlySignals | None = None) -> None:
    """A process started by the local launcher (hpctrain.process.local_launch), through hpctrain.worker."""
    try:
        reason = run(Path(run_dir), DistContext.for_spawn(local_rank, nprocs, store_path), early)
    except UserError:  # told already; the exit code says so to the launcher
        sys.exit(WORKER_USER_ERROR)
    except node_health.NodeUnhealthy as unhealthy:
        _leave_unhealthy(unhealthy)
    except fencing.Fenced as fenced:
        _leave_fenced(fenced)
    # Stopped and saved: the stop's code, as under srun. The launcher may not have had the signal
    # (one sent to the ranks alone): it learns of the stop from this, never reading 0 as a finish.
    sys.exit(STOP_TABLE[reason].exit_code if reason else WORKER_FINISHED)


def main(run_dir: Path, early: EarlySignals) -> None:
    """`python -m hpctrain.worker RUN_DIR`, once hpctrain.worker holds the early signals."""
    try:
        ctx = DistContext.from_env()
    except SlurmEnvError as error:  # a task layout hpctrain cannot train in: no retry helps
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(WORKER_USER_ERROR)
    try:
        reason = run(run_dir, ctx, early)
    except UserError:
        sys.exit(WORKER_USER_ERROR)
    except node_health.NodeUnhealthy as unhealthy:
        _leave_unhealthy(unhealthy)
    except fencing.Fenced as fenced:
        _leave_fenced(fenced)
    sys.exit(STOP_TABLE[reason].exit_code if reason else WORKER_FINISHED)


def _leave_unhealthy(unhealthy: node_health.NodeUnhealthy) -> None:
    """Journaled already: say it in the job's output and leave; srun ends the step's other tasks."""
    print(f"hpctrain: {unhealthy}; the node is left out of the run", file=sys.stderr, flush=True)
    sys.exit(WORKER_NODE_UNHEALTHY)


def _leave_fenced(fenced: fencing.Fenced) -> None:
    """A newer life owns the run dir: say so in the job's output and leave at once, running no
    cleanup that could write (a sink's close, a last metrics line)."""
    fencing.say(fenced, "error")
    sys.stdout.flush()
    os._exit(WORKER_FENCED)


def deterministic_kernels() -> None:
    """trainer.deterministic: the same kernels and reductions in every life. cuBLAS reads its
    workspace setting when it starts, before this process's first CUDA matmul."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
