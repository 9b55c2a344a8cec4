"""Hydra launcher for `hpctrain-submit -m`: check and render every sweep point, then submit all.

Hydra's basic launcher would run the points one after another; hydra-submitit-launcher waits
for every job to finish. This one returns as soon as Slurm has queued the jobs, and queues none
when any point's config is wrong.
"""


import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class SubmitLauncherConf:
    _target_: str = "hydra_plugins.hpctrain_launcher.launcher.SubmitLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="hpctrain_submit", node=SubmitLauncherConf, provider="hpctrain")


class SubmitLauncher(Launcher):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpctrain.cli.submit import prepare_point, submit_or_exit

        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info("checking and rendering %d sweep points in %s", len(job_overrides), self.config.hydra.sweep.dir)
        returns: list[JobReturn] = []
        state = Singleton.get_state()
        for offset, overrides in enumerate(job_overrides):
            index = initial_job_idx + offset
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"point_{index}"
                sweep_config.hydra.job.num = index
            returns.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=prepare_point,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            Singleton.set_state(state)
        points: list[Any] = [r.return_value for r in returns]
        if all(r.status == JobStatus.COMPLETED for r in returns) and points and not points[0].config.dry_run:
            submit_or_exit(points)
        return returns
