"""hpctrain-train: compose a config and train on this machine (trainer.nprocs processes), or as
one rank of a world started for it: `srun hpctrain-train ...` in an allocation, or torchrun
(hpctrain.process.steprun says how the tasks agree on the run dir)."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hpctrain import config as hconfig
from hpctrain import faults, logs
from hpctrain.cli import compose_once, resume
from hpctrain.cli.common import fail, importable_here, prepare_run_dir
from hpctrain.cli.overrides import before_hydra
from hpctrain.config import Config, differences, to_typed
from hpctrain.errors import UserError
from hpctrain.process import ending, steprun
from hpctrain.process.early_signals import EarlySignals
from hpctrain.process.local_launch import RankFailed, launch_local  # light: torch is imported by the training itself
from hpctrain.process.submitit_task import SubmititTask
from hpctrain.run.causes import Action, Cause
from hpctrain.run.events import Failure, Finish, Journal, read_events
from hpctrain.run.exitcodes import CLI_USER_ERROR, WORKER_HUNG
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir, restrict_umask
from hpctrain.slurm.env import SlurmEnvError

log = logging.getLogger("hpctrain")

hconfig.register()


def summary(run: RunDir) -> str:
    finish = [e for e in read_events(run.events) if isinstance(e, Finish)]
    if not finish:
        return f"run dir {run.root}: no finish event"
    last = finish[-1]
    parts = [f"step {last.step}"]
    for key in ("eval_accuracy", "eval_loss", "loss"):
        if last.extra.get(key) is not None:
            parts.append(f"{key} {last.extra[key]:.4f}")
    return f"finished: {', '.join(parts)}; run dir {run.root}"


def prepare_as_rank0(cfg: DictConfig, life: LifeStamp) -> tuple[Config, RunDir]:
    """Check and write the run dir as usual, then tell the other ranks it is ready (or not)."""
    verdict = steprun.verdict_path(Path(HydraConfig.get().runtime.output_dir), os.environ, life)
    try:
        config, run = prepare_run_dir(cfg)
    except SystemExit:  # prepare_run_dir printed why
        steprun.publish_verdict(verdict, "rank 0 refused the run dir; its error line says why")
        raise
    steprun.publish_verdict(verdict, None)
    return config, run


def follow_rank0(cfg: DictConfig, rank: int, life: LifeStamp) -> tuple[Config, RunDir]:
    """Wait for rank 0 to write config.yaml, then check it is what this task composed (a
    `${now:...}` or an environment variable in a value would make the ranks train apart)."""
    run = RunDir(Path(HydraConfig.get().runtime.output_dir))
    try:
        config, resolved = to_typed(cfg, HydraConfig.get().overrides.task)
    except ValueError as error:
        fail(str(error))
    verdict = steprun.wait_for_verdict(
        steprun.verdict_path(run.root, os.environ, life), config.trainer.collective_timeout_s
    )
    if not verdict["ok"]:
        sys.exit(CLI_USER_ERROR)  # rank 0 said why
    written = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(run.config)))
    changed = differences(written, cast(dict[str, Any], OmegaConf.to_container(resolved)))
    if changed:
        fail(
            f"rank {rank} composed another config than rank 0 wrote to {run.config} ({changed}); "
            "every task must run the same command with the same values"
        )
    return config, run


@dataclass(frozen=True)
class _Command:
    """What main() took before Hydra ran: this process's life and the signals held meanwhile."""

    life: LifeStamp
    early: EarlySignals
    pid: int  # this process: a task function pickled by value (`python -m`) carries the command along


# Set by main(). None (or another process's) where Hydra's launcher runs the task without main():
# a task of hydra-submitit-launcher's job, which reads its life from its own environment.
_command: _Command | None = None


def train_task(cfg: DictConfig) -> None:
    """The Hydra task function: in this process (hpctrain-train, hpctrain-submit's launcher),
    or in a job another Hydra launcher submitted (module-level, so it pickles by name)."""
    if _command is not None and _command.pid == os.getpid():
        _train(cfg, _command.life, _command.early)
        return
    task = SubmititTask.here()  # submitit's handlers, before anything replaces them
    # In a submitit task, a stop signal while torch imports is held for the training, as
    # hpctrain's own entry points hold it: submitit would ignore a SIGTERM and the life would
    # train on until Slurm's SIGKILL, every step since the newest checkpoint lost.
    early = EarlySignals().hold() if task is not None else None
    _train(cfg, LifeStamp.from_env(), early, task)
    if task is not None:
        task.after_finish()


def _train(cfg: DictConfig, life: LifeStamp, early: EarlySignals | None, task: SubmititTask | None = None) -> None:
    rank = steprun.world_rank(os.environ)
    logs.setup(rank=rank or 0)
    if rank is not None and cfg.trainer.nprocs != 1:
        fail(f"trainer.nprocs={cfg.trainer.nprocs}: under srun or torchrun each task is one rank; drop trainer.nprocs")
    if task is not None and (wrong := task.config_error(cfg.slurm.signal)):
        fail(wrong)
    try:
        if rank is None:
            config, run = prepare_run_dir(cfg)
        elif rank == 0:
            config, run = prepare_as_rank0(cfg, life)
        else:
            config, run = follow_rank0(cfg, rank, life)
        faults.point("train.before_launch")
        launched = time.time()
        stopped_by = launch_local(run.root, config.trainer.nprocs, config.slurm.signal, early)
    except SlurmEnvError as error:  # Slurm's environment, not the config: nothing was started
        fail(str(error))
    except RankFailed as error:  # its traceback or the watchdog's stacks are above
        _journal_the_failure(run, error, life, launched)
        print(f"error: {error}; the run dir {run.root} resumes from its newest checkpoint", file=sys.stderr)
        # The rank's own code (77: a hang, hpctrain/run/exitcodes.py), or 128+N for a signal.
        sys.exit(error.exit_code if error.exit_code > 0 else 128 - error.exit_code)
    except UserError as error:  # the worker (or a spawned rank) told it already, unless it never started
        if isinstance(error, steprun.StepError):
            fail(str(error))
        sys.exit(CLI_USER_ERROR)
    if stopped_by is not None and task is not None:
        log.info("stopped by signal %d after a checkpoint; submitit's job goes on in its next life", stopped_by)
        task.after_stop(stopped_by, rank or 0)
    if stopped_by is not None:
        log.info(
            "stopped by signal %d after a checkpoint; run the same command with hydra.run.dir=%s to resume",
            stopped_by,
            run.root,
        )
        sys.exit(128 + stopped_by)
    if not rank:
        log.info(summary(run))


def _journal_the_failure(run: RunDir, error: RankFailed, life: LifeStamp, since: float) -> None:
    """A local run's crash or hang in its journal, as a batch script records a job's: status
    then says FAILED and why, not UNKNOWN (a run with no end recorded). Unless a rank journaled
    its own since this command launched it (the hang watchdog does)."""
    if any(isinstance(e, Failure) and (e.time or 0) >= since for e in read_events(run.events)):
        return
    cause = Cause.HANG if error.exit_code == WORKER_HUNG else Cause.CRASH
    failure = Failure(
        job_id=life.job_id,
        restart=life.restart,
        cause=cause,
        exit_code=error.exit_code,
        rank=error.index,
        reason=str(error),
        action=Action.FAIL.value,
    )
    try:
        Journal(run.events).write_event(failure)
    except OSError as written:  # a full disk: the error line below still says it
        print(f"hpctrain: the failure is not in {run.events}: {written}", file=sys.stderr)


def main() -> None:
    # First: a stop signal while Hydra composes or torch imports (`srun hpctrain-train` right
    # after a backfill start) is held, and honoured once the training can say what it was.
    early = EarlySignals().hold()
    restrict_umask()  # before Hydra makes the run dir
    life = LifeStamp.from_env()  # this process's job and restart, for the run dir and the verdict
    try:
        # Before Hydra parses the command line: every task must name the same run dir.
        sys.argv += steprun.step_overrides(os.environ, sys.argv[1:], life)
    except UserError as error:
        fail(str(error))
    importable_here()  # the user's own package beside the command line
    before_hydra("hpctrain-train")
    sys.argv[1:] = resume.with_the_runs_own(sys.argv[1:])  # the run's own plan kept (cli/resume.py)
    compose_once.skip_the_mode_composition(sys.argv[1:])

    global _command
    _command = _Command(life, early, os.getpid())
    train = hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")(train_task)
    try:
        train()
        code = 0
    except SystemExit as exit:
        code = ending.code_of(exit)
    if ending.did_train_here():  # a rank of torchrun or of an srun step, not a launcher
        ending.leave(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
