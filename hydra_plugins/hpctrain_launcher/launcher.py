"""Hydra launcher for `hpctrain-submit -m`: check and render every sweep point, then submit all.

Hydra's basic launcher would run the points one after another; hydra-submitit-launcher waits
for every job to finish. This one returns as soon as Slurm has queued the jobs, and queues none
when any point's config is wrong.
"""

import functools
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hpctrain_launcher.compose import sweep_configs

if TYPE_CHECKING:
    from hpctrain.submit.submission import Point

log = logging.getLogger(__name__)


@dataclass
class SubmitLauncherConf:
    _target_: str = "hydra_plugins.hpctrain_launcher.launcher.SubmitLauncher"


ConfigStore.instance().store(
    group="hydra/launcher", name="hpctrain_submit", node=SubmitLauncherConf, provider="hpctrain"
)


class SubmitLauncher(Launcher):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpctrain.cli.common import fail
        from hpctrain.cli.submit import discard_sweep, submit_or_exit
        from hpctrain.run import lock
        from hpctrain.run.paths import RunDir
        from hpctrain.submit import forked
        from hpctrain.submit.code_snapshot import CodeSnapshot

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        try:  # one lock for the sweep: its points are checked free one by one (hpctrain.run.lock)
            lock.hold_sweep(sweep_dir)
        except lock.RunDirInUse as holder:
            fail(
                f"{sweep_dir} is in use by a live hpctrain command ({holder}); "
                "wait for it or pick a new hydra.sweep.dir"
            )
        log.info("checking and rendering %d sweep points in %s", len(job_overrides), sweep_dir)
        sweep = _Sweep(self.hydra_context.config_loader, self.config, sweep_dir, initial_job_idx)  # type: ignore[arg-type]
        # One copy of the code for every point, taken when the first point asks for it.
        shared_code = CodeSnapshot(RunDir(sweep.resolved_dir).code)
        made: list[tuple[Point, str]] = []
        try:
            # Many points: the first here (its code copied, its structure checked in full), the
            # others in forked children (hpctrain.submit.forked). Else all of them here.
            parts = forked.children_for(len(job_overrides) - 1)
            if parts > 1:
                full_checks = sweep.prepare(job_overrides[:1], 0, shared_code, made)
                full_checks += _prepare_in_children(sweep, job_overrides[1:], parts, shared_code, made)
            else:
                full_checks = sweep.prepare(job_overrides, 0, shared_code, made)
            points = [point for point, _ in made]
            log.info(
                "checked %d points, %d of them in full%s",
                len(points),
                full_checks,
                f", in {parts} processes" if parts > 1 else "",
            )
            if points and not points[0].config.dry_run:
                submit_or_exit(points)
        except BaseException:
            # A bad point, a composition error, a refusal: no point of this sweep stays behind.
            discard_sweep(sweep_dir, [point for point, _ in made])
            raise
        # No config kept per point: Hydra's sweeper reads only the return value.
        return [
            JobReturn(
                overrides=list(point.overrides),
                working_dir=working_dir,
                task_name="hpctrain",
                status=JobStatus.COMPLETED,
                _return_value=point,
            )
            for point, working_dir in made
        ]


class _Sweep:
    """What every point of one sweep shares: Hydra's loader and master config, the sweep dir."""

    def __init__(self, loader: Any, master: DictConfig, sweep_dir: Path, initial_job_idx: int) -> None:
        self.loader = loader
        self.master = master
        self.dir = sweep_dir
        self.resolved_dir = sweep_dir.resolve()
        self.initial_job_idx = initial_job_idx

    def prepare(
        self, job_overrides: Sequence[Sequence[str]], first: int, code: Any, made: list[tuple["Point", str]]
    ) -> int:
        """Check and write the points `first`, `first + 1`, ... (their overrides given), appending
        each (Point, its working dir) to `made`; returns how many needed the full check."""
        from hpctrain.cli.submit import prepare_point
        from hpctrain.config.points import PointChecker

        # The first point of each structure is checked in full, the others by what they change.
        checker = PointChecker()
        for offset, sweep_config in enumerate(sweep_configs(self.loader, self.master, job_overrides), start=first):
            # What Hydra's run_job does that a submission needs: the point's number and output
            # dir, and HydraConfig set so ${hydra:...} interpolations resolve.
            run_dir = _set_point(sweep_config, self.initial_job_idx + offset, self.dir, self.resolved_dir)
            _publish(sweep_config)
            # .hydra/overrides.yaml is written once the point is accepted (cli.common.write_run_dir).
            run_dir.mkdir(parents=True, exist_ok=True)
            structure = id(sweep_config)  # one config object per structure (compose.py)
            check = functools.partial(checker.check, structure=structure)
            made.append((prepare_point(sweep_config, code, check), str(run_dir)))
        return checker.full_checks


class _CodeWanted:
    """A child's stand-in for the sweep's code snapshot: the targets its points import, for the
    parent to copy once (two children copying one package at once would tear it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.targets: set[str] = set()

    def include(self, targets: Any, submit_dir: Path) -> None:
        self.targets.update(targets)


def _prepare_in_children(
    sweep: _Sweep, job_overrides: Sequence[Sequence[str]], parts: int, shared_code: Any, made: list[tuple["Point", str]]
) -> int:
    """Points 1.. of the sweep in `parts` forked children (hpctrain.submit.forked), appended to
    `made` in order; then the code they import copied here. Exits as the first failed child did
    (it printed what to change) once every child's points are in `made` to be removed."""
    from hpctrain.cli.common import fail
    from hpctrain.submit import forked

    def work(share: Sequence[tuple[int, Sequence[str]]], out: list[tuple["Point", str]]) -> tuple[int, set[str]]:
        wanted = _CodeWanted(shared_code.folder)
        full = sweep.prepare([overrides for _, overrides in share], share[0][0], wanted, out)
        for point, _ in out:
            point.code = None  # the parent's snapshot, set there
        return full, wanted.targets

    shares = forked.in_children(work, list(enumerate(job_overrides, start=1)), parts, into=made)
    full_checks, targets = 0, set()
    for share in shares:
        if share.extra is not None:
            full_checks += share.extra[0]
            targets |= share.extra[1]
    failed = next((share.exit_code for share in shares if share.exit_code), 0)
    if failed:
        sys.exit(failed)
    if any(point.config.slurm.code_snapshot for point, _ in made):
        try:
            shared_code.include(targets, Path(os.getcwd()))
        except OSError as error:  # a full disk, an unreadable source file (as prepare_point says it)
            fail(
                f"slurm.code_snapshot: could not copy the code into {shared_code.folder}: {error}; "
                "free space there or set slurm.code_snapshot=false"
            )
        except ValueError as error:
            fail(str(error))
    for point, _ in made:
        point.code = shared_code if point.config.slurm.code_snapshot else None
    return full_checks


def _publish(config: DictConfig) -> None:
    """Make `config` HydraConfig's. Hydra's set_config copies the whole hydra node (about 4 ms);
    HydraConfig is given the point's config itself instead, so what the launcher and compose.py
    set in its hydra node for the next points of the structure is published as it is set."""
    holder = HydraConfig.instance()
    if holder.cfg is not config:
        holder.set_config(config)  # Hydra's own checks of the node
        # set_config makes the hydra node read-only; the launcher sets it point by point
        # (read_write around every assignment cost more than the assignments).
        OmegaConf.set_readonly(config.hydra, False)
        holder.cfg = config  # type: ignore[assignment]


def _set_point(config: DictConfig, num: int, sweep_dir: Path, resolved_sweep_dir: Path) -> Path:
    """Set the point's hydra.job.id, hydra.job.num and hydra.runtime.output_dir (its run dir,
    returned). Set on the value nodes themselves: each checks the value's type as an assignment
    through the config does, at a tenth of the cost."""
    job = config.hydra.job
    job._get_node("id")._set_value(f"point_{num}")  # type: ignore[union-attr]
    job._get_node("num")._set_value(num)  # type: ignore[union-attr]
    run_dir = sweep_dir / _subdir(config, num)
    output_dir = _resolved(run_dir, sweep_dir, resolved_sweep_dir)
    config.hydra.runtime._get_node("output_dir")._set_value(str(output_dir))  # type: ignore[union-attr]
    return run_dir


def _resolved(run_dir: Path, sweep_dir: Path, resolved_sweep_dir: Path) -> Path:
    """`run_dir.resolve()`: a plain name in the sweep dir that is not a symbolic link is that name
    in the resolved sweep dir (Path.resolve looks at every folder of the path again, 0.2 ms)."""
    if run_dir.parent == sweep_dir and run_dir.name not in ("", ".", "..") and not run_dir.is_symlink():
        return resolved_sweep_dir / run_dir.name
    return run_dir.resolve()


def _subdir(config: DictConfig, num: int) -> str:
    """hydra.sweep.subdir of the point. Its default, `${hydra.job.num}`, is the point's number:
    read without OmegaConf's interpolation (about 0.2 ms a point); any other value is resolved."""
    if config.hydra.sweep._get_node("subdir")._value() == "${hydra.job.num}":  # type: ignore[union-attr]
        return str(num)
    return str(config.hydra.sweep.subdir)
