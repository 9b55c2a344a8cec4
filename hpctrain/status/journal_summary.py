"""What a run's own records say: which job it is, how often it restarted, how it last ended.

Read from events.jsonl (hpctrain/run/events.py; events written by the trainer, hpctrain.worker and
hpctrain/slurm/control.py) and submission.json (hpctrain/slurm/submit.py). This is the whole
truth for a run trained with hpctrain-train, and the fallback when Slurm no longer knows a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpctrain.run.jsonlines import read_jsonl
from hpctrain.run.paths import RunDir

# Saves forced by a signal (the trainer's StopTraining reasons): the attempt stopped there.
_SIGNAL_SAVES = {"timelimit", "preempt", "interrupt"}


@dataclass(frozen=True)
class JournalSummary:
    job_id: str | None  # the job last submitted from this run dir, else the last start's
    started: bool  # the current job (or the local run) has a `start`
    restarts: int  # requeue and relaunch events: each is one more start after a stop
    total_steps: int | None  # the last start's total_steps
    # How the current attempt ended, from its last deciding event:
    #   finish | failure | requeue | relaunch | cancelled | stopped (a signal-forced save) | pruned
    #   (hpctrain-tune's pruner stopped the trial) | None
    ending: str | None
    cause: str | None  # of that ending: requeue/failure cause, or the save's reason
    last_step: int | None  # the finish's step, else the newest checkpoint event's step


def summarize(run: RunDir) -> JournalSummary:
    events = read_jsonl(run.events)
    job_id = run.submitted_job_id()
    starts = [e for e in events if e.get("event") == "start"]
    if job_id is None and starts:
        job_id = _job_of(starts[-1])
    attempt = current_attempt(events, job_id)
    ending, cause = _ending(attempt)
    moves = sum(1 for e in events if e.get("event") in ("requeue", "relaunch"))
    restarts = max([moves, *(_int(e.get("restart")) or 0 for e in starts)])
    steps = [_int(e.get("step")) for e in events if e.get("event") in ("checkpoint", "finish")]
    return JournalSummary(
        job_id=job_id,
        started=any(e.get("event") == "start" for e in attempt),
        restarts=restarts,
        total_steps=_int(starts[-1].get("total_steps")) if starts else None,
        ending=ending,
        cause=cause,
        last_step=next((s for s in reversed(steps) if s is not None), None),
    )


def current_attempt(events: list[dict[str, Any]], job_id: str | None) -> list[dict[str, Any]]:
    """The events of the job's latest attempt: from its last `start` on. A run dir submitted
    again keeps the older job's events; until the new job writes anything, it has none."""
    ours = [i for i, e in enumerate(events) if _job_of(e) == job_id and e.get("event") != "checkpoint"]
    if not ours:
        return []
    starts = [i for i in ours if events[i].get("event") == "start"]
    # Before its first start a job can already have ended (a user's mistake at preflight).
    return events[starts[-1] if starts else ours[0] :]


def _ending(attempt: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    ending: tuple[str | None, str | None] = (None, None)
    for event in attempt:
        name = event.get("event")
        if name == "checkpoint" and event.get("reason") in _SIGNAL_SAVES:
            ending = ("stopped", event.get("reason"))
        elif name in ("finish", "failure", "requeue", "relaunch", "cancelled", "pruned"):
            ending = (name, event.get("cause"))
    return ending


def _job_of(event: dict[str, Any]) -> str | None:
    job_id = event.get("job_id")
    return str(job_id) if job_id not in (None, "") else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
