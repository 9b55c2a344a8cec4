"""Hydra launcher for `hpctrain-submit -m`: check and render every sweep point, then submit all.

Hydra's basic launcher would run the points one after another; hydra-submitit-launcher waits
for every job to finish. This one returns as soon as Slurm has queued the jobs, and queues none
when any point's config is wrong.
"""

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hpctrain_launcher.compose import sweep_configs

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
        from hpctrain.cli.submit import discard_sweep, prepare_point, submit_or_exit
        from hpctrain.config import resolved_yaml
        from hpctrain.config.points import PointChecker
        from hpctrain.run import lock
        from hpctrain.run.paths import RunDir
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
        points: list = []
        returns: list[JobReturn] = []
        # One copy of the code for every point, taken when the first point asks for it.
        resolved_sweep_dir = sweep_dir.resolve()
        shared_code = CodeSnapshot(RunDir(resolved_sweep_dir).code)
        # The first point of each structure is checked in full, the others by what they change.
        checker = PointChecker()
        try:
            configs = sweep_configs(self.hydra_context.config_loader, self.config, job_overrides)  # type: ignore[arg-type]
            for offset, sweep_config in enumerate(configs):
                # What Hydra's run_job does that a submission needs: the point's number and output
                # dir, and HydraConfig set so ${hydra:...} interpolations resolve.
                run_dir = _set_point(sweep_config, initial_job_idx + offset, sweep_dir, resolved_sweep_dir)
                _publish(sweep_config)
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / ".hydra").mkdir(exist_ok=True)
                task = [str(line) for line in sweep_config.hydra.overrides.task]
                (run_dir / ".hydra" / "overrides.yaml").write_text(resolved_yaml(task))
                structure = id(sweep_config)  # one config object per structure (compose.py)
                check = functools.partial(checker.check, structure=structure)
                point = prepare_point(sweep_config, shared_code, check)
                points.append(point)
                # No config kept per point: Hydra's sweeper reads only the return value.
                returns.append(
                    JobReturn(
                        overrides=task,
                        working_dir=str(run_dir),
                        task_name="hpctrain",
                        status=JobStatus.COMPLETED,
                        _return_value=point,
                    )
                )
            log.info("checked %d points, %d of them in full", len(points), checker.full_checks)
            if points and not points[0].config.dry_run:
                submit_or_exit(points)
        except BaseException:
            # A bad point, a composition error, a refusal: no point of this sweep stays behind.
            discard_sweep(sweep_dir, points)
            raise
        return returns


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
