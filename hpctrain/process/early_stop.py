"""A stop signal that came while a training process was still starting: the `stop` record, and
the stop's reason, before the heavy imports.

A preemption often lands right after a job starts (a backfilled job is the first a higher
priority one takes back), while its tasks still import torch: seconds at every start, and tens
of seconds on a loaded node. Slurm kills the tasks GraceTime seconds after its SIGTERM, so a task
that waited for torch before it said anything could be killed first, and its life would read as
a crash instead of a preemption with nothing lost (a loaded CI machine took over 20 s, its
GraceTime, to import torch in a submitit task). The launcher asks here before anything imports
torch; the training process asks again after its imports (a signal that came meanwhile).

Imports nothing heavy (no torch): the run's journal and checkpoint names only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from hpctrain.process.early_signals import EarlySignals
from hpctrain.process.signals import StopFlag
from hpctrain.run.causes import StopReason
from hpctrain.run.events import Journal, Stop
from hpctrain.run.life import LifeStamp
from hpctrain.run.paths import RunDir, checkpoints_in

log = logging.getLogger(__name__)


def held_stop(
    run_dir: Path, early: EarlySignals, timelimit_signal: str, life: LifeStamp, rank: int
) -> StopReason | None:
    """The stop a signal held in `early` asks for, journaled (None: no stop signal came yet, and
    `early` holds on). Only when one came are the stop handlers installed: from then on a signal
    goes to them, and the caller leaves without training."""
    if not early.received:
        return None
    stop = StopFlag(timelimit_signal)
    stop.install()
    early.hand_over(set(stop.signal_names), stop.note)
    reason = stop.agreed_alone()
    if reason is not None:
        journal_stop(run_dir, life, rank, reason, stop)
    return reason


def journal_stop(run_dir: Path, life: LifeStamp, rank: int, reason: StopReason, stop: StopFlag) -> None:
    """Nothing was trained in this life, the newest checkpoint stands: said in a `stop` record
    (by any rank that saw the signal early: the others may be waiting in the rendezvous, and srun
    kills them when this one leaves)."""
    newest = checkpoints_in(RunDir(run_dir).checkpoints)
    since = time.monotonic() - (stop.requested_at or time.monotonic())
    Journal(RunDir(run_dir).events).write_event(
        Stop(
            job_id=life.job_id,
            restart=life.restart,
            step=newest[0].step if newest else 0,
            reason=reason,
            deadline_s=0.0,  # no save: nothing new to keep
            since_signal_s=round(since, 3),
        )
    )
    log.info("rank %d: %s signal before training started; nothing to save, leaving", rank, reason.value)
