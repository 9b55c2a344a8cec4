"""Start the training processes of a run on this machine."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch.multiprocessing as mp

from hpctrain import worker
from hpctrain.dist import DistContext

log = logging.getLogger(__name__)


def launch_local(run_dir: Path, nprocs: int) -> None:
    """Under torchrun this process is already one rank; otherwise spawn `nprocs` ranks."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        worker.run(run_dir, DistContext.from_env())
        return
    if nprocs == 1:
        worker.run(run_dir, DistContext.single())
        return
    # A file:// rendezvous in a fresh private folder: no port to pick, none to collide.
    with tempfile.TemporaryDirectory(prefix="hpctrain-rdzv-") as rendezvous:
        store = os.path.join(rendezvous, "store")
        log.info("spawning %d processes", nprocs)
        mp.start_processes(
            worker.spawned, args=(nprocs, store, str(run_dir)), nprocs=nprocs, join=True, start_method="spawn"
        )
