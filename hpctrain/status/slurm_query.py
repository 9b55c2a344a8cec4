"""Ask Slurm about many jobs in few calls: what each job's state is now.

One `squeue` for every job id (jobs queued or running), then one `sacct` for the ids squeue
no longer lists (a site with accounting remembers every job, and every life of a requeued one),
then one `scontrol` for the ids still unanswered (the controller keeps an ended job for MinJobAge
seconds, 300 by default). When the caller wants usage too (hpctrain-status's cost), the one sacct
call asks about those jobs as well, running ones included: each life's ElapsedRaw and AllocTRES
(hpctrain.status.usage), while its states still only count for the ids squeue no longer lists.
Many small clusters have no accounting: sacct then says "accounting storage is disabled", which
is normal and not reported; any other sacct failure is a note.
A job none of them knows is left to the run's own journal. Calls go through hpctrain.slurm.client
(one try each, LOOK: the callers decide nothing without squeue's answer); a missing command or a
failing controller never raises, it adds a note.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hpctrain.slurm import client
from hpctrain.slurm.client import Kind, Purpose
from hpctrain.slurm.jobid import JOB_ID, expand, sort_key
from hpctrain.slurm.states import base_state
from hpctrain.status.usage import Usage, tracks_gpus, usage_of

# JobID names an array task `36_7` (its JobIDRaw is the task's own number); a plain job's is its id.
# ElapsedRaw (seconds) and AllocTRES (`billing=4,cpu=4,gres/gpu=4,node=2`): what each life held.
SACCT_FIELDS = "JobIDRaw,State,JobID,ElapsedRaw,AllocTRES"
# What sacct says (exit 1) on a cluster without slurmdbd: normal, not worth a note.
ACCOUNTING_DISABLED = "accounting storage is disabled"
# A job (`36`) or an array task (`36_7`): squeue, sacct, scancel take both (hpctrain.slurm.jobid).
_JOB_ID = JOB_ID


@dataclass(frozen=True)
class SlurmJob:
    state: str  # as Slurm spells it: RUNNING, PENDING, COMPLETED, PREEMPTED...
    reason: str | None  # why it waits (squeue/scontrol); None when there is none
    restarts: int | None  # Slurm's own count (scontrol), or the lives sacct lists less one
    source: str  # the command that answered: squeue | sacct | scontrol


@dataclass
class SlurmAnswer:
    jobs: dict[str, SlurmJob] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one line each, for the user
    # squeue answered: a job it does not list is neither queued nor running (what a retry or
    # a cancel must know for sure).
    squeue_answered: bool = False
    # Each asked job's lives as accounting recorded them, oldest first (only when usage was asked
    # and sacct answered: a job it does not list has no usage there).
    usage: dict[str, list[Usage]] = field(default_factory=dict)
    sacct_answered: bool = False


def query(job_ids: list[str], purpose: Purpose = Purpose.LOOK, usage_of: Sequence[str] = ()) -> SlurmAnswer:
    """The state of each of `job_ids`; with `usage_of`, also what accounting says those jobs held."""
    answer = SlurmAnswer()
    wanted = sorted({j for j in job_ids if _JOB_ID.match(j)}, key=sort_key)
    usage_ids = sorted({j for j in usage_of if _JOB_ID.match(j)}, key=sort_key)
    if not wanted and not usage_ids:
        return answer
    if wanted and not client.available(client.SQUEUE):
        answer.notes.append(f"{client.SQUEUE} not found on PATH: states come from the runs' own journals")
    elif wanted:
        answer.jobs.update(_squeue(wanted, purpose, answer))
    left = [j for j in wanted if j not in answer.jobs]
    asked = sorted({*left, *usage_ids}, key=sort_key)
    if asked and client.available(client.SACCT):
        text = _sacct(asked, purpose, answer.notes)
        if text is not None:
            answer.sacct_answered = True
            answer.jobs.update(parse_sacct(text, left))
            answer.usage = parse_usage(text, usage_ids)
    left = [j for j in wanted if j not in answer.jobs]
    if left and client.available(client.SCONTROL):
        answer.jobs.update(_scontrol(left, purpose, answer.notes))
    return answer


def _squeue(job_ids: list[str], purpose: Purpose, answer: SlurmAnswer) -> dict[str, SlurmJob]:
    listed = client.queue(job_ids, purpose)
    done = listed.reply
    if done.kind in (Kind.MISSING, Kind.TIMED_OUT):
        answer.notes.append(f"{done.why()}; states come from scontrol and the runs' journals")
        return {}
    # Asked about a single job it no longer lists, squeue fails with "Invalid job id
    # specified"; about several, it lists those it knows. Both mean: not queued.
    if done.exit_code != 0 and "Invalid job id" not in done.stderr:
        answer.notes.append(f"squeue failed: {done.first_line()}")
        return {}
    answer.squeue_answered = True
    return {
        row.job_id: SlurmJob(row.state, row.reason, None, client.SQUEUE)
        for row in listed.value
        if _JOB_ID.match(row.job_id)
    }


def _sacct(job_ids: list[str], purpose: Purpose, notes: list[str]) -> str | None:
    """sacct's lines about every life of `job_ids` (oldest first: PREEMPTED, NODE_FAIL, REQUEUED
    ... then the current one); None when it did not answer."""
    accounted = client.accounting(job_ids, SACCT_FIELDS, purpose)
    done = accounted.reply
    if done.kind in (Kind.MISSING, Kind.TIMED_OUT):
        notes.append(done.why())
        return None
    if done.exit_code != 0:
        # sacct's errors end with the one that says what is wrong ("Problem talking to the database").
        if ACCOUNTING_DISABLED not in done.stderr:
            notes.append(f"sacct failed: {done.last_line()}")
        return None
    return accounted.value


def parse_sacct(text: str, job_ids: list[str]) -> dict[str, SlurmJob]:
    """`sacct -n -P -X --duplicates -o JobIDRaw,State` output -> the asked jobs' current state.

    A job's lines come oldest life first; its last line is its state now and the lines before it
    are the lives a requeue ended. An array task has its own JobIDRaw (`6_1` may be 8), so only
    lines whose JobIDRaw is an asked id count, or whose JobID (third field) is: `6_1`, or a
    pending array's `6_[1-3%2]` standing for each of its tasks."""
    lives: dict[str, list[str]] = {}
    for name, parts in sacct_lines(text, job_ids):
        # "CANCELLED by 1000": the state is the first word.
        lives.setdefault(name, []).append(base_state(parts[1]))
    return {job_id: SlurmJob(states[-1], None, len(states) - 1, client.SACCT) for job_id, states in lives.items()}


def parse_usage(text: str, job_ids: Sequence[str]) -> dict[str, list[Usage]]:
    """`sacct -n -P -X --duplicates -o SACCT_FIELDS` -> each asked job's lives, oldest first (the
    n-th is the life Slurm started with SLURM_RESTART_COUNT n; a pending one holds nothing yet)."""
    lives: dict[str, list[Usage]] = {}
    gpus_tracked = tracks_gpus(text)
    for name, parts in sacct_lines(text, job_ids):
        usage = usage_of(parts, gpus_tracked)
        if usage is not None:
            lives.setdefault(name, []).append(usage)
    return lives


def sacct_lines(text: str, job_ids: Sequence[str]) -> Iterator[tuple[str, list[str]]]:
    """Each line of `sacct -n -P -X -o JobIDRaw,State,JobID,...` about an asked job, oldest life
    first, with the asked id it is about (a pending array's line is about each asked task)."""
    asked = set(job_ids)
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[1]:
            continue
        if parts[0] in asked:
            names = [parts[0]]
        else:
            names = [j for j in expand(parts[2]) if j in asked] if len(parts) > 2 else []
        for name in names:
            yield name, parts


def _scontrol(job_ids: list[str], purpose: Purpose, notes: list[str]) -> dict[str, SlurmJob]:
    shown = client.show_jobs(job_ids, purpose)
    done = shown.reply
    if done.kind in (Kind.MISSING, Kind.TIMED_OUT):
        notes.append(done.why())
        return {}
    jobs = {}
    for record in shown.value:
        # An array task's record: JobId is its own number, the asked id is `<array>_<task>`.
        for name in record.names:
            if name in job_ids:
                jobs[name] = SlurmJob(record.state, record.reason, record.restarts, client.SCONTROL)
    if not jobs and done.exit_code != 0 and "Invalid job id" not in done.stderr:
        notes.append(f"scontrol failed: {done.first_line()}")
    return jobs
