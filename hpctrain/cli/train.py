"""hpctrain-train: compose a config and train on this machine (trainer.nprocs processes)."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli.common import prepare_run_dir
from hpctrain.journal import read_jsonl
from hpctrain.launch import launch_local
from hpctrain.rundir import RunDir

log = logging.getLogger("hpctrain")

hconfig.register()


def summary(run: RunDir) -> str:
    finish = [e for e in read_jsonl(run.events) if e.get("event") == "finish"]
    if not finish:
        return f"run dir {run.root}: no finish event"
    last = finish[-1]
    parts = [f"step {last.get('step')}"]
    for key in ("eval_accuracy", "eval_loss", "loss"):
        if last.get(key) is not None:
            parts.append(f"{key} {last[key]:.4f}")
    return f"finished: {', '.join(parts)}; run dir {run.root}"


@hydra.main(version_base="1.3", config_path="pkg://hpctrain.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    config, run = prepare_run_dir(cfg)
    stopped_by = launch_local(run.root, config.trainer.nprocs, config.slurm.signal)
    if stopped_by is not None:
        log.info("stopped by signal %d after a checkpoint; run the same command with hydra.run.dir=%s to resume",
                 stopped_by, run.root)
        sys.exit(128 + stopped_by)
    log.info(summary(run))


if __name__ == "__main__":
    main()
