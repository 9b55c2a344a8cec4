"""How long a signal-forced save may take, and what to do when a write cannot fit.

A stop signal gives the job a fixed time before Slurm kills it: `slurm.signal_delay_s` before
the time limit, the partition's GraceTime after a preemption's SIGTERM. A forced save that
outlasts it is killed half-way and the job loses everything since its last checkpoint (after a
time limit it is not even requeued). `plan_forced_save` is the decision, a pure function:

    choice              when                                              the steps to redo
    written             no write under way; a full write fits             0
    waited              the write under way and then a full write fit     0
    abandoned_inflight  only a full write fits: the write under way is    0
                        cancelled (its temporary file removed; the
                        newest complete checkpoint stays valid)
    inflight_only       only the write under way fits: it completes,      stop step - its step
                        the stop step is not written
    skipped             nothing fits: any write under way is cancelled,   stop step - newest
                        the newest complete checkpoint is kept            complete checkpoint

With no deadline (Ctrl-C, a plain `kill`) or no estimate yet (nothing written so far), the save
waits and writes, as it would without a deadline. A write still under way when the usable part
of the deadline is over is cancelled ("overran", see hpctrain.checkpoint.forced): a job that
exits in time is requeued from its newest complete checkpoint, one killed during a write after
a time limit is not requeued at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.run.causes import StopReason
from hpctrain.run.life import LifeStamp
from hpctrain.slurm import client
from hpctrain.slurm.records import parse_job_record, parse_partition

log = logging.getLogger(__name__)

# Of the time a signal gives, what the exit after the save needs (the other ranks' barrier, the
# process group's teardown, the batch shell's requeue): the larger of these is kept free.
MARGIN_S = 2.0
MARGIN_FRACTION = 0.15
# The GraceTime assumed when it cannot be read: Slurm's default KillWait, the time between the
# SIGTERM and the SIGKILL of a job that is cancelled without a grace time.
DEFAULT_GRACE_S = 30.0
GRACE_ENV = "HPCTRAIN_GRACE_TIME_S"

# What a forced save did: the plan's choices, and "overran" when a write it chose was still under
# way at the deadline (the estimate was wrong) and was cancelled so that the job exits in time.
CHOICES = ("written", "waited", "abandoned_inflight", "inflight_only", "skipped", "overran")


@dataclass(frozen=True)
class ForcedSavePlan:
    choice: str  # one of CHOICES
    why: str
    redo_steps: int  # steps after the checkpoint the next start resumes from


def usable_s(deadline_s: float) -> float:
    """The part of the deadline a save may use."""
    return deadline_s - max(MARGIN_S, MARGIN_FRACTION * deadline_s)


def plan_forced_save(
    stop_step: int,
    deadline_s: float | None,
    write_s: float | None,
    inflight_step: int | None,
    inflight_left_s: float | None,
    complete_step: int | None,
) -> ForcedSavePlan:
    """`write_s`: the estimated time of a full write of the stop step; `inflight_left_s`: of the
    write under way (of `inflight_step`); `complete_step`: the newest complete checkpoint."""
    if deadline_s is None or write_s is None:
        choice = "waited" if inflight_step is not None else "written"
        return ForcedSavePlan(choice, "no deadline" if deadline_s is None else "no write time measured yet", 0)
    usable = usable_s(deadline_s)
    if inflight_step is None:
        if write_s <= usable:
            return ForcedSavePlan("written", f"a write (~{write_s:.1f} s) fits in {usable:.1f} s", 0)
        return _skipped(stop_step, complete_step, f"a write (~{write_s:.1f} s) does not fit in {usable:.1f} s")
    left = write_s if inflight_left_s is None else inflight_left_s
    if left + write_s <= usable:
        why = f"the write under way (~{left:.1f} s) and a full write (~{write_s:.1f} s) fit in {usable:.1f} s"
        return ForcedSavePlan("waited", why, 0)
    if write_s <= usable:
        return ForcedSavePlan(
            "abandoned_inflight",
            f"the write under way (~{left:.1f} s left) and a full write (~{write_s:.1f} s) do not both fit in "
            f"{usable:.1f} s; a full write alone does",
            0,
        )
    if left <= usable:
        return ForcedSavePlan(
            "inflight_only",
            f"a full write (~{write_s:.1f} s) does not fit in {usable:.1f} s; "
            f"the write under way (~{left:.1f} s left) does",
            stop_step - inflight_step,
        )
    return _skipped(
        stop_step,
        complete_step,
        f"neither the write under way (~{left:.1f} s left) nor a full write (~{write_s:.1f} s) fits in {usable:.1f} s",
    )


def _skipped(stop_step: int, complete_step: int | None, why: str) -> ForcedSavePlan:
    kept = f"keeping the checkpoint of step {complete_step}" if complete_step is not None else "no checkpoint yet"
    return ForcedSavePlan("skipped", f"{why}; {kept}", stop_step - (complete_step or 0))


def deadline_s(reason: StopReason, since_signal_s: float, signal_delay_s: float, grace_s: float) -> float | None:
    """Seconds left for a forced save: the time-limit warning's head start, the preemption's grace
    (both less the time since the signal), or None for an interrupt (the user waits)."""
    given = {StopReason.TIMELIMIT: signal_delay_s, StopReason.PREEMPT: grace_s}.get(reason)
    return None if given is None else max(0.0, given - since_signal_s)


def grace_time_s(environ: Mapping[str, str] | None = None) -> float:
    """The job's partition's GraceTime: from $HPCTRAIN_GRACE_TIME_S when set, else read with
    scontrol (inside a Slurm job), else DEFAULT_GRACE_S, with a warning saying why."""
    env = os.environ if environ is None else environ
    given = env.get(GRACE_ENV)
    if given is not None:
        try:
            return float(given)
        except ValueError:
            log.warning("%s=%r is not a number of seconds; assuming %.0f s", GRACE_ENV, given, DEFAULT_GRACE_S)
            return DEFAULT_GRACE_S
    job_id = LifeStamp.from_env(env).job_id
    if not job_id:
        return DEFAULT_GRACE_S  # not a Slurm job: SIGTERM comes from a user or an init system
    try:
        return _read_grace(job_id, env)
    except ValueError as error:
        log.warning(
            "could not read the partition's GraceTime (%s); a forced save on preemption assumes %.0f s "
            "(set %s to override)",
            error,
            DEFAULT_GRACE_S,
            GRACE_ENV,
        )
        return DEFAULT_GRACE_S


def _scontrol(env: Mapping[str, str], *args: str) -> str:
    done = client.run(["scontrol", *args], client.IN_JOB, env=env)
    if not done.ok:
        raise ValueError(f"scontrol {' '.join(args)}: {done.why()}")
    return done.stdout


def _read_grace(job_id: str, env: Mapping[str, str]) -> float:
    record = parse_job_record(_scontrol(env, "show", "job", "--oneliner", job_id))
    if record is None or record.partition is None:
        raise ValueError(f"scontrol show job {job_id} printed no Partition=")
    grace = parse_partition(_scontrol(env, "show", "partition", "--oneliner", record.partition)).get("GraceTime")
    if grace is None:
        raise ValueError(f"scontrol show partition {record.partition} printed no GraceTime=")
    return float(grace)
