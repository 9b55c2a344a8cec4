"""hpctrain-submit: compose, check, render and queue a job (or a sweep with -m), then return.

    hpctrain-submit slurm.nodes=4 slurm.gpus_per_node=8 optim.lr=3e-4
    hpctrain-submit -m optim.lr=1e-4,3e-4 model=convnet,mlp     # every point its own job
    hpctrain-submit dry_run=true                                 # print the script, queue nothing

A sweep runs through hpctrain's Hydra launcher (hydra_plugins/hpctrain_launcher), which checks
and renders every point first and then submits them all at once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli.common import prepare_run_dir
from hpctrain.slurm import sbatch
from hpctrain.slurm.submit import Point, discard_run_dir, submit_all, write_script

hconfig.register()


def prepare_point(cfg: DictConfig) -> Point:
    """Check the config, write config.yaml and job.sbatch into the point's run dir."""
    from hydra.core.hydra_config import HydraConfig

    config, run = prepare_run_dir(cfg)
    point = Point(config=config, run=run, overrides=list(HydraConfig.get().overrides.task))
    try:
        write_script(point, Path(os.getcwd()))
    except ValueError as error:  # a bad template or a value sbatch cannot take
        discard_run_dir(run.root)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return point


def announce(points: list[Point], job_ids: list[str]) -> None:
    for point, job_id in zip(points, job_ids):
        print(f"Submitted batch job {job_id}")
        print(f"  run dir: {point.run.root}")
    sys.stdout.flush()


def submit_or_exit(points: list[Point]) -> list[str]:
    try:
        job_ids = submit_all(points, points[0].config.slurm.submit_parallelism if points else 1)
    except sbatch.SbatchError as error:
        print(f"error: {error}", file=sys.stderr)
        print("nothing was queued and no run dir was kept", file=sys.stderr)
        sys.exit(1)
    announce(points, job_ids)
    return job_ids


@hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="submit")
def main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    point = prepare_point(cfg)
    if point.config.dry_run:
        print(point.script.read_text(), end="")
        print(f"# dry run: nothing queued; the run dir {point.run.root} holds job.sbatch and config.yaml")
        return
    submit_or_exit([point])


if __name__ == "__main__":
    main()
