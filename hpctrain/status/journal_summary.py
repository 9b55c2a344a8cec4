"""What a run's own records say: which job it is, how often it restarted, how it last ended.

Read from events.jsonl (hpctrain/run/events.py; events written by the trainer, hpctrain.worker and
hpctrain/recovery/control.py) and submission.json (hpctrain/submit/submission.py). This is the whole
truth for a run trained with hpctrain-train, and the fallback when Slurm no longer knows a job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain.run import lock
from hpctrain.run.causes import Word, stop_reason
from hpctrain.run.events import ENDINGS, Checkpoint, Event, Finish, Relaunch, Requeue, Start, read_events
from hpctrain.run.paths import RunDir


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
    cause: Word | None  # of that ending: requeue/failure Cause, or the save's StopReason
    last_step: int | None  # the finish's step, else the newest checkpoint event's step
    dry_run: bool = False  # hpctrain-submit dry_run=true wrote it: a job script, never submitted
    live_here: str | None = None  # a live hpctrain command of this machine holds it (hpctrain.run.lock)
    # Every Slurm job of the run, oldest first: those its events name, then the one submitted last.
    jobs: tuple[str, ...] = ()


def summarize(run: RunDir) -> JournalSummary:
    events = read_events(run.events)
    job_id = run.submitted_job_id()
    starts = [e for e in events if isinstance(e, Start)]
    if job_id is None and starts:
        job_id = starts[-1].job_id or None
    attempt = current_attempt(events, job_id)
    ending, cause = _ending(attempt)
    moves = sum(1 for e in events if isinstance(e, (Requeue, Relaunch)))
    restarts = max([moves, *(e.restart or 0 for e in starts)])
    steps = [e.step for e in events if isinstance(e, (Checkpoint, Finish))]
    return JournalSummary(
        job_id=job_id,
        started=any(isinstance(e, Start) for e in attempt),
        restarts=restarts,
        total_steps=starts[-1].total_steps if starts else None,
        ending=ending,
        cause=cause,
        last_step=steps[-1] if steps else None,
        dry_run=not events and job_id is None and run.job_script.exists(),
        live_here=lock.live_holder(run),
        jobs=tuple(dict.fromkeys([*(e.job_id for e in events if e.job_id), *([job_id] if job_id else [])])),
    )


def current_attempt(events: Sequence[Event], job_id: str | None) -> Sequence[Event]:
    """The events of the job's latest attempt: from its last `start` on. A run dir submitted
    again keeps the older job's events; until the new job writes anything, it has none."""
    ours = [i for i, e in enumerate(events) if (e.job_id or None) == job_id and not isinstance(e, Checkpoint)]
    if not ours:
        return []
    starts = [i for i in ours if isinstance(events[i], Start)]
    # Before its first start a job can already have ended (a user's mistake at preflight).
    return events[starts[-1] if starts else ours[0] :]


def _ending(attempt: Sequence[Event]) -> tuple[str | None, Word | None]:
    ending: tuple[str | None, Word | None] = (None, None)
    for event in attempt:
        stopped_by = stop_reason(event.reason) if isinstance(event, Checkpoint) else None
        if stopped_by is not None:
            ending = ("stopped", stopped_by)
        elif isinstance(event, ENDINGS):
            ending = (event.name, getattr(event, "cause", None))
    return ending
