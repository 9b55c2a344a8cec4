"""hpctrain-train: compose a config and train on this machine (trainer.nprocs processes)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli.common import prepare_run_dir
from hpctrain.launch import launch_local

hconfig.register()


@hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    config, run = prepare_run_dir(cfg)
    launch_local(run.root, config.trainer.nprocs)


if __name__ == "__main__":
    main()
