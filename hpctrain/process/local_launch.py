"""Start the training processes of a run on this machine.

With trainer.nprocs > 1 the ranks are forked from a forkserver that imported torch and the
trainer once (hpctrain.process.rank_server). This launcher itself never imports torch: it only starts,
watches and signals processes (the standard library does that), and a second of CPU per run
is a second less between a job's start and its first step.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType

from hpctrain.errors import UserError
from hpctrain.process import door as worker
from hpctrain.process import early_stop
from hpctrain.process.early_signals import EarlySignals
from hpctrain.process.steprun import world_rank
from hpctrain.run.causes import STOP_TABLE, StopReason, signal_of
from hpctrain.run.events import Stop, read_events
from hpctrain.run.exitcodes import WORKER_HUNG, WORKER_USER_ERROR
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir

log = logging.getLogger(__name__)

# After one rank failed, how long the others get to leave on their own SIGTERM (a save of what
# they hold is not wanted here: the run crashed) before they are killed.
FAILED_RANK_GRACE_S = 30.0


class RankFailed(RuntimeError):
    """A spawned rank ended with a non-zero exit code: the run crashed (its traceback, if it
    raised, is on stderr above this error)."""

    def __init__(self, index: int, exit_code: int) -> None:
        self.index = index
        self.exit_code = exit_code
        how = f"was killed by {signal.Signals(-exit_code).name}" if exit_code < 0 else f"exited with code {exit_code}"
        super().__init__(f"training process {index} {how}")


def launch_local(
    run_dir: Path, nprocs: int, timelimit_signal: str = "USR2", early: EarlySignals | None = None
) -> int | None:
    """Under torchrun, or as a task of a multi-task srun step, this process is already one rank;
    otherwise spawn `nprocs` ranks.
    `timelimit_signal` is slurm.signal without "SIG": the warning a scheduler sends before the
    time limit. `early` holds the signals that came while this process was starting: the
    training honours them (or the ranks, which are sent them). Returns the signal number that
    stopped the run early, or None when it finished."""
    timelimit = getattr(signal, f"SIG{timelimit_signal}")

    def signal_of_stop(reason: StopReason | None) -> int | None:
        return None if reason is None else signal_of(reason, timelimit_signal)

    task_rank = world_rank(os.environ)
    if early is not None:
        # A stop that came while this command started: said and honoured before torch is imported
        # (seconds, or tens of them on a loaded node, which Slurm's GraceTime may not leave).
        rank = task_rank or int(os.environ.get("RANK", "0"))
        held = early_stop.held_stop(run_dir, early, timelimit_signal, LifeStamp.from_env(), rank)
        if held is not None:
            return signal_of_stop(held)
    if task_rank is not None or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        from hpctrain.dist.context import DistContext

        return signal_of_stop(worker.run(run_dir, DistContext.from_env(), early))
    if nprocs == 1:
        from hpctrain.dist.context import DistContext

        return signal_of_stop(worker.run(run_dir, DistContext.single(), early))
    # A file:// rendezvous in a fresh private folder: no port to pick, none to collide.
    with tempfile.TemporaryDirectory(prefix="hpctrain-rdzv-") as rendezvous:
        store = os.path.join(rendezvous, "store")
        log.info("spawning %d processes", nprocs)
        ended = _run_ranks(nprocs, store, run_dir, (signal.SIGTERM, signal.SIGINT, timelimit), early)
    if ended.received:
        return ended.received[0]
    if ended.stopped:  # for a signal sent to the ranks alone: the stop they agreed on says which
        stops = [e for e in read_events(RunDir(run_dir).events) if isinstance(e, Stop)]
        return signal_of_stop(stops[-1].reason if stops else StopReason.PREEMPT)
    return None


# What a spawned rank exits with after a stop it saved for (hpctrain.process.life.spawned).
_STOP_CODES = frozenset(entry.exit_code for entry in STOP_TABLE.values())


@dataclass(frozen=True)
class Ended:
    """How the spawned ranks ended, all of them having exited without failing."""

    received: list[int]  # the stop signals this launcher had and forwarded, in order
    stopped: bool  # the ranks stopped and saved (their stop's exit code), whatever sent the signal


def _run_ranks(nprocs: int, store: str, run_dir: Path, forwarded: tuple[int, ...], early: EarlySignals | None) -> Ended:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["hpctrain.process.rank_server"])
    ranks = [
        context.Process(target=worker.spawned, args=(i, nprocs, store, str(run_dir), os.getpid()), name=f"rank-{i}")
        for i in range(nprocs)
    ]
    received: list[int] = []

    def send(signum: int) -> None:
        for rank in ranks:
            if rank.pid is not None and rank.is_alive():
                os.kill(rank.pid, signum)

    def forward(signum: int, frame: FrameType | None) -> None:
        # Ctrl-C reaches every process of the terminal; a `kill` reaches only this one.
        received.append(signum)
        send(signum)

    # Every signal the ranks act on, or the one this launcher dies of would reach them only as
    # the SIGINT a rank sends itself once the launcher is gone (hpctrain.process.door.spawned),
    # saved under the wrong reason.
    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        for rank in ranks:
            rank.start()
        # What came while the ranks were being started, and what came before this launcher could
        # forward anything: every rank holds its stop signals from its first instruction, so a
        # signal sent now is honoured before it trains.
        for signum in received:
            send(signum)
        if early is not None:
            early.hand_over(set(forwarded), lambda signum, arrived_at: forward(signum, None))
        stopped = _wait_all(ranks)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return Ended(received, stopped)


def _wait_all(ranks: Sequence[BaseProcess]) -> bool:
    """Wait for every rank; at the first that fails, end the others and raise. Returns whether
    they stopped and saved for a signal (their stop's exit code) rather than finished."""
    waiting = {rank.sentinel: i for i, rank in enumerate(ranks)}
    stopped = False
    while waiting:
        # A timeout, so a signal's handler runs within a second whatever the platform does.
        for sentinel in multiprocessing.connection.wait(list(waiting), timeout=1.0):
            index = waiting.pop(sentinel)  # type: ignore[arg-type]
            ranks[index].join()
            exit_code = ranks[index].exitcode or 0
            if exit_code in _STOP_CODES:
                stopped = True
            elif exit_code != 0:
                # After a hang the others are stuck in the same collective (or stopped, as the
                # silent peer that caused it): a SIGTERM cannot reach their handlers, so no grace.
                _end_the_others(ranks, 0.0 if exit_code == WORKER_HUNG else FAILED_RANK_GRACE_S)
                if exit_code == WORKER_USER_ERROR:  # the rank told why, as one error line
                    raise UserError(f"training process {index} refused the run")
                raise RankFailed(index, exit_code)
    return stopped


def _end_the_others(ranks: Sequence[BaseProcess], grace_s: float) -> None:
    alive = [rank for rank in ranks if rank.is_alive()]
    for rank in alive:
        log.warning("ending training process %s (pid %s): another one failed", rank.name, rank.pid)
        rank.terminate()
    deadline = time.monotonic() + grace_s
    for rank in alive:
        rank.join(max(0.0, deadline - time.monotonic()))
        if rank.is_alive():
            rank.kill()
            rank.join()
