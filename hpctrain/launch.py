"""Start the training processes of a run on this machine."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from pathlib import Path
from types import FrameType

import torch.multiprocessing as mp

from hpctrain import worker
from hpctrain.dist import DistContext
from hpctrain.errors import UserError
from hpctrain.run.causes import StopReason
from hpctrain.run.exitcodes import WORKER_USER_ERROR
from hpctrain.steprun import world_rank

log = logging.getLogger(__name__)


def launch_local(run_dir: Path, nprocs: int, timelimit_signal: str = "USR2") -> int | None:
    """Under torchrun, or as a task of a multi-task srun step, this process is already one rank;
    otherwise spawn `nprocs` ranks.
    `timelimit_signal` is slurm.signal without "SIG": the warning a scheduler sends before the
    time limit. Returns the signal number that stopped the run early, or None when it finished."""
    timelimit = getattr(signal, f"SIG{timelimit_signal}")
    signal_of = {
        None: None,
        StopReason.PREEMPT: signal.SIGTERM,
        StopReason.INTERRUPT: signal.SIGINT,
        StopReason.TIMELIMIT: timelimit,
    }
    if world_rank(os.environ) is not None or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return signal_of[worker.run(run_dir, DistContext.from_env())]
    if nprocs == 1:
        return signal_of[worker.run(run_dir, DistContext.single())]
    # A file:// rendezvous in a fresh private folder: no port to pick, none to collide.
    with tempfile.TemporaryDirectory(prefix="hpctrain-rdzv-") as rendezvous:
        store = os.path.join(rendezvous, "store")
        log.info("spawning %d processes", nprocs)
        # Forked from a server that imported torch and the trainer once (hpctrain.rank_server).
        mp.set_forkserver_preload(["hpctrain.rank_server"])
        context = mp.start_processes(
            worker.spawned, args=(nprocs, store, str(run_dir)), nprocs=nprocs, join=False, start_method="forkserver"
        )
        received: list[int] = []

        def forward(signum: int, frame: FrameType | None) -> None:
            # Ctrl-C reaches every process of the terminal; a `kill` reaches only this one.
            received.append(signum)
            for process in context.processes:
                if process.is_alive() and process.pid is not None:
                    os.kill(process.pid, signum)

        # Every signal the ranks act on, or the one this launcher dies of would reach them only
        # as torch's parent-death SIGINT, saved under the wrong reason.
        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, timelimit)}
        try:
            while not context.join(timeout=1):
                pass
        except mp.ProcessExitedException as ended:
            if ended.exit_code == WORKER_USER_ERROR:  # the rank told why, as one error line
                raise UserError(f"training process {ended.error_index} refused the run") from ended
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return received[0] if received else None
