"""hpctrain-train: compose a config and train on this machine (trainer.nprocs processes)."""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig
from torch.multiprocessing import ProcessExitedException

from hpctrain import config as hconfig
from hpctrain import logs
from hpctrain.cli.common import EXIT_USER_ERROR, prepare_run_dir
from hpctrain.errors import UserError
from hpctrain.launch import launch_local
from hpctrain.run.exitcodes import WORKER_USER_ERROR
from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir, restrict_umask

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
def _main(cfg: DictConfig) -> None:
    logs.setup(rank=0)
    config, run = prepare_run_dir(cfg)
    try:
        stopped_by = launch_local(run.root, config.trainer.nprocs, config.slurm.signal)
    except UserError:  # in this process (one rank, or torchrun's): the worker told it already
        sys.exit(EXIT_USER_ERROR)
    except ProcessExitedException as ended:
        if ended.exit_code != WORKER_USER_ERROR:
            raise
        sys.exit(EXIT_USER_ERROR)  # a spawned rank told it already
    if stopped_by is not None:
        log.info(
            "stopped by signal %d after a checkpoint; run the same command with hydra.run.dir=%s to resume",
            stopped_by,
            run.root,
        )
        sys.exit(128 + stopped_by)
    log.info(summary(run))


def main() -> None:
    restrict_umask()  # before Hydra makes the run dir
    _main()


if __name__ == "__main__":
    main()
