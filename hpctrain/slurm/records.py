"""`scontrol show job -o` and `scontrol show partition -o`, parsed once for every caller.

A job record is one line of `Key=value` fields, but not every value is a word: JobName comes
second and holds whatever the user gave (spaces, quotes, `JobState=COMPLETED`: see
tests/fixtures/slurm/scontrol/hostile_held.txt), and so may Account, QOS and Comment on a
cluster without accounting. So the fields are found as the runs Slurm always prints together,
in its order:

    JobId=5 [ArrayJobId=4 ArrayTaskId=0 ...] JobName=<any text> ... Account=<any> QOS=<any>
    JobState=RUNNING Reason=<may hold spaces> Dependency=(null) Requeue=1 Restarts=0 ...
    Partition=batch AllocNode:Sid=h:1 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1
    [BatchHost=node1] NumNodes=1 ... Command=<any> WorkDir=<any> [Comment=<any>] StdErr=<any> ...

The second run is looked for after the first, so text after it (a path, a comment) cannot stand
in for it; a name would have to copy the whole first run, Dependency to Restarts, to be taken for
it. Another Slurm version may order the fields otherwise: then each is the first `Key=` found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.slurm.jobid import expand

# An array task's record goes on `ArrayJobId=36 ArrayTaskId=7` (a pending meta record: `3-9%2`).
# Fed commands on stdin, scontrol may echo its prompt before a record.
_HEAD = re.compile(r"^(?:scontrol: )?JobId=(\d+) (?:ArrayJobId=(\d+) ArrayTaskId=(\S+) )?")
# Reason may hold spaces but never another ` JobState=`: a name holding `JobState=X Reason=Y` is
# passed over (the real run follows it).
_STATE = re.compile(r" JobState=(\S+) Reason=((?:(?! JobState=).)*?) Dependency=\S* Requeue=\d+ Restarts=(\d+) ")
# After the times that follow Restarts (their values are dates, N/A or None: no spaces).
_PREEMPT = re.compile(r" Deadline=\S+ PreemptEligibleTime=\S+ PreemptTime=(\S+) SuspendTime=")
_PLACE = re.compile(
    r" Partition=(\S+) AllocNode:Sid=\S* ReqNodeList=\S* ExcNodeList=(\S*) NodeList=(\S*)"
    r"(?: SchedNodeList=\S*)?(?: BatchHost=(\S+))? "
)


def _loose(name: str, line: str) -> str | None:
    found = re.search(rf" {name}=(\S*)", line)
    return found.group(1) if found else None


@dataclass(frozen=True)
class JobRecord:
    job_id: str  # JobId: the job's own number (an array task's differs from its array's)
    state: str  # JobState as Slurm spells it: RUNNING, PENDING, COMPLETED, ...
    reason: str | None = None  # why it waits (BeginTime after a requeue); None when there is none
    restarts: int | None = None  # Slurm's count of requeues
    array_job_id: str | None = None
    array_task_id: str | None = None  # `7`, or a pending meta record's `3-9%2`
    partition: str | None = None
    node_list: str | None = None  # the nodes it holds now (with --no-kill a failed one leaves)
    batch_host: str | None = None
    exc_node_list: str | None = None
    # When Slurm chose this job for preemption (its grace runs from then); None when it did not.
    preempt_time: str | None = None
    # The job's --constraint as Slurm shows it (Features=fast&ib); None when it has none.
    features: str | None = None
    # The job's QOS (QOS=normal): under PreemptType=preempt/qos its GraceTime is the QOS's.
    qos: str | None = None
    # NumNodes as Slurm shows it: `2`, or `2-2` / `2-4` for a pending job (min-max).
    num_nodes: str | None = None

    @property
    def timed_out(self) -> bool:
        """Its time limit ended it: JobState=COMPLETING Reason=TimeLimit while Slurm kills its
        processes (tests/fixtures/slurm/scontrol/stop_timelimit.txt), TIMEOUT after."""
        return self.state == "TIMEOUT" or self.reason == "TimeLimit"

    @property
    def being_ended(self) -> bool:
        """Slurm is ending it, and not for its time limit: JobState=COMPLETING or CANCELLED after a
        scancel (tests/fixtures/slurm/scontrol/stop_cancelled.txt). A requeue in progress looks
        alike but counts a restart more (the caller compares Restarts)."""
        return self.state in ("COMPLETING", "CANCELLED") and not self.timed_out

    @property
    def names(self) -> list[str]:
        """Every job id this record answers for: its number, and `<array>_<task>` for each task."""
        if self.array_job_id is None or self.array_task_id is None:
            return [self.job_id]
        return [self.job_id, *expand(f"{self.array_job_id}_[{self.array_task_id}]")]


def parse_job_record(line: str) -> JobRecord | None:
    """One `scontrol show job -o` line; None when it is not a job record."""
    head = _HEAD.match(line)
    if head is None:
        return None
    job_id, array_job, array_task = head.groups()
    state = _STATE.search(line, head.end() - 1)
    restarts: int | None
    if state is not None:
        state_word, reason, restarts = state.group(1), reason_of(state.group(2)), int(state.group(3))
        preempted = _PREEMPT.search(line, state.end() - 1)
        preempt_time = preempted.group(1) if preempted else None
        place = _PLACE.search(line, state.end() - 1)
    else:
        word, count = _loose("JobState", line), _loose("Restarts", line)
        if not word:
            return None
        state_word, reason, restarts = word, None, int(count) if count and count.isdigit() else None
        preempt_time = _loose("PreemptTime", line)
        place = None
    if place is not None:
        partition, excluded, nodes, batch_host = place.groups()
    else:
        partition, excluded, nodes, batch_host = (
            _loose(k, line) for k in ("Partition", "ExcNodeList", "NodeList", "BatchHost")
        )
    return JobRecord(
        job_id=job_id,
        state=state_word,
        reason=reason,
        restarts=restarts,
        array_job_id=array_job,
        array_task_id=array_task,
        partition=_value(partition),
        node_list=_value(nodes),
        batch_host=_value(batch_host),
        exc_node_list=_value(excluded),
        preempt_time=None if _value(preempt_time) in (None, "None") else preempt_time,
        features=_value(_loose("Features", line)),
        qos=_value(_loose("QOS", line)),
        num_nodes=_value(_loose("NumNodes", line)),
    )


def parse_job_records(text: str) -> list[JobRecord]:
    """Every job record in `scontrol -o show job` output (one, or many fed on stdin)."""
    return [record for record in map(parse_job_record, text.splitlines()) if record is not None]


def parse_partition(text: str) -> dict[str, str]:
    """`scontrol show partition -o NAME`: its `Key=value` words (names, lists and numbers only)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def parse_reservations(text: str) -> list[dict[str, str]]:
    """`scontrol show reservation -o`: one dict of `Key=value` words a reservation ("No
    reservations in the system" gives none)."""
    return [parse_partition(line) for line in text.splitlines() if line.startswith("ReservationName=")]


def _value(text: str | None) -> str | None:
    return None if text in (None, "", "(null)") else text


def reason_of(text: str) -> str | None:
    """A job's Reason (scontrol) or %r (squeue); None for Slurm's ways of saying there is none."""
    text = text.strip()
    return None if text in ("", "None", "(None)", "(null)") else text


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`: `Name = value` lines."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and " " not in name.strip():
            found[name.strip()] = value.strip()
    return found
