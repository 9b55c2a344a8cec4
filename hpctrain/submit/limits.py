"""The site's limits on what one user may queue, read from Slurm before a sweep is queued.

    scontrol show config      MaxArraySize (task ids 0..MaxArraySize-1), AccountingStorageEnforce
    sacctmgr show assoc/qos   MaxSubmitJobs (queued + running) and MaxJobs (running) of the
                              user's association and of the QOS the job runs in
    squeue -u USER -r         the jobs the user has queued now, each array task counted, as Slurm does

`check` is pure (tested as a table): a sweep over the submit limit is refused with the numbers,
before anything is queued; MaxJobs only says how many will run at once. Without accounting
(sacctmgr fails, or Slurm does not enforce limits) there is no submit limit to check.
"""

from __future__ import annotations

import getpass
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from hpctrain.slurm import client
from hpctrain.slurm.client import Purpose
from hpctrain.slurm.jobid import tasks_in

log = logging.getLogger(__name__)

# Slurm's default MaxArraySize, assumed when `scontrol show config` gives no answer.
DEFAULT_MAX_ARRAY_SIZE = 1001
# Every call here is asked before anything is queued: worth waiting out a controller restart.
ASKING = Purpose.READ
# The sacctmgr fields read (assoc_limits, qos_limits).
ASSOC_FIELDS = "Cluster,Account,User,Partition,MaxSubmit,MaxJobs,QOS,DefaultQOS"
QOS_FIELDS = "Name,MaxSubmitPU,MaxJobsPU"


@dataclass(frozen=True)
class Limit:
    value: int
    source: str  # where it is set, for the message: "association root/root (MaxSubmitJobs)"


@dataclass(frozen=True)
class Limits:
    max_array_size: int
    submit: Limit | None = None  # queued + running jobs, the tightest of association and QOS
    running: Limit | None = None  # jobs running at once
    queued: int = 0  # the user's jobs in the queue now (array tasks counted)


@dataclass(frozen=True)
class Verdict:
    refusal: str | None  # set: queue nothing, tell the user this
    note: str | None  # set: say this (how many will run at once)


def check(points: int, limits: Limits, parallelism: int | None = None, guardians: int = 0) -> Verdict:
    """May `points` more jobs, and `guardians` guardian jobs beside them, be queued? Slurm counts
    every array task as a job, and a guardian (hpctrain.recovery.guardian: one for each point
    queued as a job of its own, one for each array) waits in the queue as a job of its own."""
    submit = limits.submit
    jobs = points + guardians
    if submit is not None and limits.queued + jobs > submit.value:
        room = max(0, submit.value - limits.queued)
        said = (
            f"the sweep has {points} points but {submit.source} allows {submit.value} jobs queued or running "
            f"and {limits.queued} are queued already, so {room} more fit; "
        )
        if not guardians:
            return Verdict(
                said + f"submit a sweep of at most {room} points, or wait until some of your jobs have ended", None
            )
        # Each guarded point takes two places: with every point guarded, half the room.
        fit = room // 2 if guardians == points else max(0, room - guardians)
        return Verdict(
            said + f"with {guardians} guardian jobs (slurm.guardian) the sweep queues {jobs}: submit a sweep of "
            f"at most {fit} points, set slurm.guardian=false (one job a point, a lost batch node then ends its "
            "run), or wait until some of your jobs have ended",
            None,
        )
    running = limits.running
    at_once = [n for n in (running.value if running else None, parallelism) if n is not None]
    if at_once and min(at_once) < points:
        why = f"{running.source}" if running and running.value == min(at_once) else "slurm.array_parallelism"
        return Verdict(None, f"at most {min(at_once)} of the {points} points run at once ({why})")
    return Verdict(None, None)


# ---- Slurm's answers, parsed (fixtures captured from the dev cluster in tests) -----------------


def enforces_limits(config: dict[str, str]) -> bool:
    """Slurm applies association and QOS limits only with AccountingStorageEnforce limits/safe/all."""
    flags = set(config.get("AccountingStorageEnforce", "none").lower().replace(" ", "").split(","))
    return bool(flags & {"limits", "safe", "all"})


def parse_int(field: str) -> int | None:
    """sacctmgr's number field; empty means no limit."""
    field = field.strip()
    return int(field) if field.isdigit() else None


def tightest(*limits: Limit | None) -> Limit | None:
    present = [limit for limit in limits if limit is not None]
    return min(present, key=lambda limit: limit.value) if present else None


def assoc_limits(text: str, cluster: str, account: str | None) -> tuple[Limit | None, Limit | None, str | None]:
    """`sacctmgr -n -P show assoc where user=U format=Cluster,Account,User,Partition,MaxSubmit,
    MaxJobs,QOS,DefaultQOS` -> (submit, running, default QOS) of the association the job uses:
    its account's (the first listed when slurm.account is unset, as the user's default)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or (cluster and parts[0] != cluster) or (account and parts[1] != account):
            continue
        name = f"association {parts[2]}/{parts[1]}" + (f" partition {parts[3]}" if parts[3] else "")
        submit, running = parse_int(parts[4]), parse_int(parts[5])
        return (
            Limit(submit, f"{name} (MaxSubmitJobs)") if submit is not None else None,
            Limit(running, f"{name} (MaxJobs)") if running is not None else None,
            # No DefaultQOS: a job gets the association's only QOS (Slurm's default is `normal`).
            parts[7] or (parts[6] if parts[6] and "," not in parts[6] else None),
        )
    return None, None, None


def qos_limits(text: str, qos: str) -> tuple[Limit | None, Limit | None]:
    """`sacctmgr -n -P show qos format=Name,MaxSubmitPU,MaxJobsPU` -> (submit, running) per user."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] == qos:
            submit, running = parse_int(parts[1]), parse_int(parts[2])
            return (
                Limit(submit, f"QOS {qos} (MaxSubmitJobsPerUser)") if submit is not None else None,
                Limit(running, f"QOS {qos} (MaxJobsPerUser)") if running is not None else None,
            )
    return None, None


def count_queued(job_ids: Iterable[str]) -> int:
    """The jobs Slurm counts for `squeue -h -r -o %i`'s ids, one per job or array task (a meta
    record counted by its tasks)."""
    return sum(tasks_in(job_id.strip()) for job_id in job_ids if job_id.strip())


# ---- asking Slurm ------------------------------------------------------------------------------


class SlurmLimitsError(RuntimeError):
    """A call Slurm must answer failed: the message says which and what to check."""


def read_limits(account: str | None, qos: str | None) -> Limits:
    """The limits a sweep submitted now would meet. MaxArraySize falls back to Slurm's default
    (with a warning) when `scontrol show config` fails; accounting that does not answer means no
    submit limit is known (said at info level); squeue must answer when a limit is to be checked."""
    shown = client.show_config(ASKING)
    if not shown.ok:
        log.warning("`scontrol show config` failed (%s): assuming MaxArraySize=%d", shown.why(), DEFAULT_MAX_ARRAY_SIZE)
        return Limits(DEFAULT_MAX_ARRAY_SIZE)
    config = shown.value
    max_array = parse_int(config.get("MaxArraySize", "")) or DEFAULT_MAX_ARRAY_SIZE
    if not enforces_limits(config):
        log.info(
            "Slurm enforces no association or QOS limits here (AccountingStorageEnforce=%s): no submit limit checked",
            config.get("AccountingStorageEnforce", "none"),
        )
        return Limits(max_array)
    submit, running = _accounting_limits(config.get("ClusterName", ""), account, qos)
    if submit is None and running is None:
        return Limits(max_array)
    user = _user()
    queued = client.user_jobs(user, ASKING)
    if not queued.ok:
        raise SlurmLimitsError(
            f"`squeue -u {user}` failed ({queued.why()}): the jobs you have queued are needed to check the "
            "submit limit; nothing was queued; check that the Slurm controller answers (squeue --me)"
        )
    return Limits(max_array, submit, running, count_queued(queued.value))


def _accounting_limits(cluster: str, account: str | None, qos: str | None) -> tuple[Limit | None, Limit | None]:
    user = _user()
    associations = client.associations(user, ASSOC_FIELDS, ASKING)
    if not associations.ok:
        log.info("sacctmgr gave no associations (%s): no submit limit checked", associations.why())
        return None, None
    assoc_submit, assoc_running, default_qos = assoc_limits(associations.value, cluster, account)
    job_qos = qos or default_qos or "normal"
    shown = client.qos(job_qos, QOS_FIELDS, ASKING)
    if not shown.ok:
        log.info("sacctmgr gave no QOS %s (%s): only the association's limits are checked", job_qos, shown.why())
        return assoc_submit, assoc_running
    qos_submit, qos_running = qos_limits(shown.value, job_qos)
    return tightest(assoc_submit, qos_submit), tightest(assoc_running, qos_running)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
