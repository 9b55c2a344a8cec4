"""What every training process runs: `python -m hpctrain.worker RUN_DIR` is the command srun or
torchrun starts on every task; the local launcher starts `spawned` in each process it spawns.
Both read the run dir's config.yaml; the life itself is hpctrain.process.life.

This module imports nothing heavy on purpose: its first act is to hold the stop signals
(hpctrain.process.early_signals), so a preemption or a time-limit warning that lands while torch is
still importing is honoured (no step trained, nothing lost) instead of killing the process as
a crash.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import faults
from hpctrain.process import ending, heartbeat, startup_clock
from hpctrain.process.early_signals import HELD, EarlySignals
from hpctrain.run import fencing, launch_marks

if TYPE_CHECKING:
    from hpctrain.dist.context import DistContext
    from hpctrain.run.causes import StopReason


def run(run_dir: Path, ctx: DistContext, early: EarlySignals | None = None) -> StopReason | None:
    """Train in this process (hpctrain-train under srun or torchrun, or a single process)."""
    from hpctrain.process import life as train_process

    return train_process.run(run_dir, ctx, early)


def spawned(local_rank: int, nprocs: int, store_path: str, run_dir: str, launcher_pid: int) -> None:
    """Entry of a process started by the local launcher (hpctrain.process.local_launch)."""
    early = EarlySignals().hold()
    # The launcher gone (killed, its terminal closed): SIGINT, so this rank saves as an
    # interrupt and leaves instead of training on alone.
    _stop_when_gone(launcher_pid, signal.SIGINT)
    # Started by a forkserver, this process inherited "forkserver" as its default start method:
    # its DataLoader workers would each import torch again (seconds per worker, at every epoch
    # without persistent workers). Back to Python's default, as a rank under srun or torchrun has.
    multiprocessing.set_start_method(None, force=True)
    # Forked from hpctrain.process.rank_server, the stop signals come blocked: held now, let them in.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    from hpctrain.process import life as train_process

    train_process.spawned(local_rank, nprocs, store_path, run_dir, early)


def _stop_when_gone(launcher_pid: int, signum: int) -> None:
    """Send this process `signum` once the launcher has ended. Its parent is the rank server,
    which outlives the launcher while any rank lives (each holds the server's keep-alive pipe),
    so a parent-death signal would never come: a thread waits on the launcher itself instead."""
    import select
    import threading

    try:
        launcher = os.pidfd_open(launcher_pid)  # readable once that process has ended
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signum)
        return
    except (AttributeError, OSError):  # no pidfd (kernel before 5.3): look once a second
        launcher = None

    def wait() -> None:
        if launcher is not None:
            select.select([launcher], [], [])
        else:
            while _alive(launcher_pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait, name="launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> None:
    startup_clock.mark("began")
    early = EarlySignals().hold()
    # The mark that the step's tasks began (hpctrain.run.launch_marks; the first task of each node):
    # without it, a failed step is one srun never launched (slurmctld away), charged to no budget.
    words = sys.argv[1:] if argv is None else argv
    if words and not words[0].startswith("-"):
        launch_marks.leave(Path(words[0]), os.environ)
    # A rank of this launch: a relaunch decided after it fences this process (hpctrain.run.fencing).
    fencing.join_step(os.environ)
    # Forked by a warm standby (hpctrain.process.standby), the stop signals come blocked: held now, let in.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
    # The beats to the batch script's watcher begin before the imports: a node that dies while
    # torch loads is heard too (a no-op outside hpctrain's own batch script).
    beating = heartbeat.start(os.environ, int(os.environ.get("SLURM_PROCID") or 0))
    try:
        faults.point("worker.before_imports")
        parser = argparse.ArgumentParser(description="Run one training process of a run directory.")
        parser.add_argument("run_dir", type=Path, help="a run directory holding config.yaml")
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        from hpctrain.process import life as train_process  # torch, the trainer: seconds at every start

        startup_clock.mark("imported")
        faults.point("worker.after_imports")
        try:
            train_process.main(args.run_dir, early)
            code = 0
        except SystemExit as exit:  # train_process.main always ends so, with the life's code
            code = ending.code_of(exit)
    finally:
        if beating is not None:
            beating.bye()
    if ending.did_train_here():
        ending.leave(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
