"""What every training process runs: join the group, train, always clean up.

`python -m hpctrain.worker RUN_DIR` is the command srun or torchrun starts on every task; the
local launcher calls `run` in each spawned process. Both read the run dir's config.yaml.
Exit codes: 0 finished; signals.EXIT_REQUEUE / EXIT_STOPPED after a signal-forced checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

import torch

from hpctrain import dist as hdist
from hpctrain import logs
from hpctrain.config import load_run_config
from hpctrain.dist import DistContext
from hpctrain.signals import StopFlag, exit_code
from hpctrain.trainer.trainer import StopTraining, Trainer

log = logging.getLogger(__name__)


def run(run_dir: Path, ctx: DistContext) -> str | None:
    """Train; returns None when finished, or the stop reason after a signal-forced save."""
    logs.setup(ctx.rank)
    config = load_run_config(run_dir)
    # Handlers first: a signal from here on is honoured at the first step boundary.
    stop = StopFlag(config.slurm.signal)
    stop.install()
    # Threads before any work: the count is part of what makes a run bit-reproducible.
    torch.set_num_threads(config.trainer.threads)
    hdist.init_process_group(ctx, config.trainer.backend, config.trainer.collective_timeout_s, run_dir)
    trainer = None
    try:
        log.info("rank %d/%d on %s (%s), run dir %s", ctx.rank, ctx.world_size, ctx.device, ctx.source, run_dir)
        trainer = Trainer(config, ctx, run_dir, stop)
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


def spawned(local_rank: int, nprocs: int, store_path: str, run_dir: str) -> None:
    """Entry of a process started by the local launcher (torch.multiprocessing)."""
    run(Path(run_dir), DistContext.for_spawn(local_rank, nprocs, store_path))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one training process of a run directory.")
    parser.add_argument("run_dir", type=Path, help="a run directory holding config.yaml")
    args = parser.parse_args(argv)
    reason = run(args.run_dir, DistContext.from_env())
    sys.exit(exit_code(reason) if reason else 0)


if __name__ == "__main__":
    main()
