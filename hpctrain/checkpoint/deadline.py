"""How long a signal-forced save may take, and what to do when a write cannot fit.

A stop signal gives the job a fixed time before Slurm kills it: `slurm.signal_delay_s` before
the time limit; after a SIGTERM, the partition's GraceTime when Slurm chose the job for
preemption (and GraceTime is not 0), KillWait otherwise (scancel, an admin's `scontrol requeue`,
a preemption without grace): see `sigterm_s`. A forced save that
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
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from hpctrain.run.causes import STOP_TABLE, Grace, StopReason
from hpctrain.run.life import LifeStamp
from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.times import time_limit_s

log = logging.getLogger(__name__)
T = TypeVar("T")

# Of the time a signal gives, what the exit after the save needs (the other ranks' barrier, the
# process group's teardown, the batch shell's requeue): the larger of these is kept free.
MARGIN_S = 2.0
MARGIN_FRACTION = 0.15
# The seconds `control begin` took in this life, exported by the batch shell: its calls to Slurm
# (how quickly slurmctld answers now) and its Python's start, through slurm.task_prefix where the
# control step runs in a container (after-step and the requeue pay that start too). After-step and
# the requeue make up to AFTER_SAVE_CALLS times those calls; the control step never spends more
# than CONTROL_BOUND_S on them
# (hpctrain.recovery.control.SLURM_BUDGET_S, 20 s, and the exit around them).
CONTROL_S_ENV = "HPCTRAIN_CONTROL_S"
AFTER_SAVE_CALLS = 3.0
CONTROL_BOUND_S = 25.0
# The GraceTime assumed when it cannot be read: Slurm's default KillWait, the time between the
# SIGTERM and the SIGKILL of a job that is cancelled without a grace time.
DEFAULT_GRACE_S = 30.0
GRACE_ENV = "HPCTRAIN_GRACE_TIME_S"
# KillWait when it cannot be read: Slurm's default.
DEFAULT_KILL_WAIT_S = 30.0
KILL_WAIT_ENV = "HPCTRAIN_KILL_WAIT_S"
# What a forced save did: the plan's choices, and "overran" when a write it chose was still under
# way at the deadline (the estimate was wrong) and was cancelled so that the job exits in time.
CHOICES = ("written", "waited", "abandoned_inflight", "inflight_only", "skipped", "overran")


@dataclass(frozen=True)
class ForcedSavePlan:
    choice: str  # one of CHOICES
    why: str
    redo_steps: int  # steps after the checkpoint the next start resumes from


def usable_s(deadline_s: float, after_s: float = 0.0) -> float:
    """The part of the deadline a save may use; `after_s`: what the job needs after it
    (`after_save_s`), kept free when it is more than the margin, but never more than
    AFTER_SAVE_SHARE of the deadline: on a loaded machine three control calls measured at 1.7 s
    each took more than a 5 s KillWait, and a 0.02 s save of the stop step was skipped to keep
    time for bookkeeping that the next `control begin` redoes if it is cut."""
    return deadline_s - max(MARGIN_S, MARGIN_FRACTION * deadline_s, min(after_s, AFTER_SAVE_SHARE * deadline_s))


# The most of a deadline kept free for what comes after a forced save (usable_s).
AFTER_SAVE_SHARE = 0.5


def after_save_s(env: Mapping[str, str]) -> float:
    """What the job needs after a forced save, from this life's own measure: after-step and,
    after a time limit, the requeue ask Slurm what `control begin` asked and more, so up to
    AFTER_SAVE_CALLS times the seconds begin took (the batch shell exports them), plus the margin,
    and never more than the control step's own bound on its calls. 0 outside hpctrain's jobs."""
    given = env.get(CONTROL_S_ENV)
    if not given:
        return 0.0
    try:
        took = max(0.0, float(given))
    except ValueError:
        log.warning("%s=%r is not a number of seconds; the margin is not widened", CONTROL_S_ENV, given)
        return 0.0
    return min(AFTER_SAVE_CALLS * took + MARGIN_S, CONTROL_BOUND_S)


def plan_forced_save(
    stop_step: int,
    deadline_s: float | None,
    write_s: float | None,
    inflight_step: int | None,
    inflight_left_s: float | None,
    complete_step: int | None,
    after_s: float = 0.0,
) -> ForcedSavePlan:
    """`write_s`: the estimated time of a full write of the stop step; `inflight_left_s`: of the
    write under way (of `inflight_step`); `complete_step`: the newest complete checkpoint;
    `after_s`: what the job needs after the save (`after_save_s`)."""
    if deadline_s is None or write_s is None:
        choice = "waited" if inflight_step is not None else "written"
        return ForcedSavePlan(choice, "no deadline" if deadline_s is None else "no write time measured yet", 0)
    usable = usable_s(deadline_s, after_s)
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


def deadline_s(reason: StopReason, since_signal_s: float, signal_delay_s: float, sigterm_given: float) -> float | None:
    """Seconds left for a forced save: the time-limit warning's head start, what a SIGTERM gives
    (`sigterm_s`; both less the time since the signal), or None for an interrupt (the user waits)."""
    given = {Grace.SIGNAL_DELAY: signal_delay_s, Grace.SIGTERM: sigterm_given}.get(STOP_TABLE[reason].grace)
    return None if given is None else max(0.0, given - since_signal_s)


@dataclass(frozen=True)
class SigtermTimes:
    """What Slurm gives between a SIGTERM and its SIGKILL, read once at start-up."""

    grace_s: float  # the partition's GraceTime: a preemption's (0: Slurm's default, none)
    kill_wait_s: float  # KillWait: after scancel, `scontrol requeue`, or the end of a grace

    @property
    def preemption_differs(self) -> bool:
        """Whether the answer to "was it a preemption?" changes the deadline."""
        return self.grace_s > 0 and self.grace_s != self.kill_wait_s


def sigterm_s(times: SigtermTimes, preempted: bool | None) -> float:
    """Seconds from a SIGTERM to Slurm's SIGKILL (slurm.conf(5), GraceTime and KillWait):

    the SIGTERM                                   gives
    a preemption, GraceTime > 0                   GraceTime: at its end the tasks and the batch
                                                  shell get SIGTERM again, and KillWait after
                                                  that is the control step's
    a preemption, GraceTime 0                     KillWait
    scancel, `scontrol requeue`, a node set down  KillWait
    not known (Slurm did not answer)              the smaller of the two: never more than
                                                  either could give
    """
    if preempted is None and times.grace_s > 0:
        return min(times.grace_s, times.kill_wait_s)
    if preempted and times.grace_s > 0:
        return times.grace_s
    return times.kill_wait_s


def preempted_now(environ: Mapping[str, str] | None = None) -> bool | None:
    """After a SIGTERM: whether Slurm chose this job for preemption (its record shows a
    PreemptTime); None without an answer in the short time a SIGTERM leaves (AFTER_SIGTERM), or
    outside a Slurm job."""
    env = os.environ if environ is None else environ
    job_id = LifeStamp.from_env(env).job_id
    if not job_id:
        return None
    record = client.show_job(job_id, Purpose.AFTER_SIGTERM, env=env).value
    return None if record is None else record.preempt_time is not None


def sigterm_times(environ: Mapping[str, str] | None = None) -> SigtermTimes:
    """GraceTime (`grace_time_s`) and KillWait: each from its environment variable when set, else
    from Slurm inside a job (`scontrol show partition`, `scontrol show config`), else Slurm's
    defaults (outside Slurm a SIGTERM comes from a user or an init system: no grace)."""
    env = os.environ if environ is None else environ
    in_job = bool(LifeStamp.from_env(env).job_id)
    grace = grace_time_s(env) if in_job or GRACE_ENV in env else 0.0
    kill_wait = _seconds_from(env, KILL_WAIT_ENV)
    if kill_wait is None:
        kill_wait = _read_kill_wait(env) if in_job else DEFAULT_KILL_WAIT_S
    return SigtermTimes(grace, kill_wait)


# At a forced save, how long to wait for a reading still under way: a stop that comes within the
# first moments of a life (a signal held through the start) finds it done unless Slurm is away.
READING_WAIT_S = 1.0


class SigtermTimesReading:
    """`sigterm_times` read in a thread of its own from the moment a life starts: a start never
    waits for Slurm (with slurmctld away, each of its two scontrol calls would hold the first step
    back by up to an IN_JOB call's time limit), and only a SIGTERM needs the answer."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if environ is None else environ)
        self._times: SigtermTimes | None = None
        self._thread = threading.Thread(target=self._read, name="hpctrain-sigterm-times", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self._times = sigterm_times(self._env)

    def get(self, wait_s: float = READING_WAIT_S) -> SigtermTimes:
        """The times read, waiting up to `wait_s` for them; still unread (Slurm has not answered
        since the start), Slurm's defaults, as for times that could not be read."""
        self._thread.join(wait_s)
        if self._times is not None:
            return self._times
        log.warning(
            "GraceTime and KillWait not read yet (Slurm has not answered since the start); this save "
            "assumes Slurm's defaults (GraceTime %.0f s, KillWait %.0f s; set %s and %s to override)",
            DEFAULT_GRACE_S,
            DEFAULT_KILL_WAIT_S,
            GRACE_ENV,
            KILL_WAIT_ENV,
        )
        return SigtermTimes(DEFAULT_GRACE_S, DEFAULT_KILL_WAIT_S)


def _read_kill_wait(environ: Mapping[str, str]) -> float:
    try:
        value = _answered(client.show_config(Purpose.IN_JOB, env=environ), "scontrol show config").get("KillWait", "")
        return float(value.split()[0])  # "5 sec"
    except (ValueError, IndexError) as error:
        log.warning(
            "could not read KillWait (%s); a forced save after scancel or a requeue assumes %.0f s "
            "(set %s to override)",
            error or "scontrol show config printed no KillWait",
            DEFAULT_KILL_WAIT_S,
            KILL_WAIT_ENV,
        )
        return DEFAULT_KILL_WAIT_S


def _seconds_from(environ: Mapping[str, str], name: str) -> float | None:
    given = environ.get(name)
    if given is None:
        return None
    try:
        return float(given)
    except ValueError:
        log.warning("%s=%r is not a number of seconds; ignored", name, given)
        return None


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


def _read_qos_grace(name: str) -> float:
    """The QOS's GraceTime (`sacctmgr -n -P show qos where name=NAME format=GraceTime`, printed as
    `00:02:00`), in seconds."""
    text = _answered(client.qos(name, "GraceTime", Purpose.IN_JOB), f"sacctmgr show qos {name}").strip()
    seconds = time_limit_s(text.splitlines()[0]) if text else None
    if seconds is None:
        raise ValueError(f"sacctmgr show qos {name} printed no GraceTime ({text!r})")
    return seconds


def _answered(done: client.Answer[T], asked: str) -> T:
    """What scontrol said; a ValueError that says why when it did not answer."""
    if not done.ok:
        raise ValueError(f"{asked}: {done.why()}")
    return done.value


def grace_source(preempt_type: str) -> str:
    """Whose GraceTime a preempted job gets, by the cluster's PreemptType (slurm.conf(5)):
    its QOS's under preempt/qos (sacctmgr's GraceTime), its partition's otherwise."""
    return "qos" if preempt_type.strip() == "preempt/qos" else "partition"


def _read_grace(job_id: str, env: Mapping[str, str]) -> float:
    record = _answered(client.show_job(job_id, Purpose.IN_JOB, env=env), f"scontrol show job {job_id}")
    config = _answered(client.show_config(Purpose.IN_JOB, env=env), "scontrol show config")
    if grace_source(config.get("PreemptType", "")) == "qos":
        if record is None or record.qos is None:
            raise ValueError(f"scontrol show job {job_id} printed no QOS= (PreemptType=preempt/qos)")
        return _read_qos_grace(record.qos)
    if record is None or record.partition is None:
        raise ValueError(f"scontrol show job {job_id} printed no Partition=")
    partition = client.show_partition(record.partition, Purpose.IN_JOB, env=env)
    grace = _answered(partition, f"scontrol show partition {record.partition}").get("GraceTime")
    if grace is None:
        raise ValueError(f"scontrol show partition {record.partition} printed no GraceTime=")
    return float(grace)
